package opstate

import (
	"fmt"
	"strings"
	"testing"

	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestJournaledReportSlimmed: a report too big for the journal keeps its
// outcome, nodes and plan there, not its events and per-node actions.
func TestJournaledReportSlimmed(t *testing.T) {
	rep := &coordinatorv1.Report{OperationId: "op1", State: coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED, Plan: &coordinatorv1.PlanResponse{}}
	for i := range 200 {
		n := fmt.Sprintf("worker-%03d.cluster.example", i)
		rep.Nodes = append(rep.Nodes, &coordinatorv1.NodeResult{Node: n, Port: 4889})
		rep.Plan.Nodes = append(rep.Plan.Nodes, &coordinatorv1.NodePlan{Node: n, Actions: []string{strings.Repeat("iptables -t filter -I OPENSHIFT-FIREWALL-ALLOW ", 20)}})
		rep.Events = append(rep.Events, &coordinatorv1.OperationEvent{Node: n, Message: strings.Repeat("x", 2000)})
	}
	b, err := JournaledReport(rep)
	if err != nil || len(b) > maxJournaledRecord {
		t.Fatalf("%d bytes (limit %d): %v", len(b), maxJournaledRecord, err)
	}
	got := &coordinatorv1.Report{}
	if err := protojson.Unmarshal(b, got); err != nil {
		t.Fatal(err)
	}
	if len(got.Nodes) != 200 || len(got.Plan.GetNodes()) != 200 || len(got.Events) != 0 || got.State != coordinatorv1.OperationState_OPERATION_STATE_SUCCEEDED {
		t.Errorf("slimmed report: %d nodes, %d plan nodes, %d events, %s", len(got.Nodes), len(got.Plan.GetNodes()), len(got.Events), got.State)
	}
	small := &coordinatorv1.Report{OperationId: "op1", Events: rep.Events[:2]}
	if b, _ := JournaledReport(small); !strings.Contains(string(b), "xxxx") {
		t.Errorf("a small report lost its events")
	}
}
