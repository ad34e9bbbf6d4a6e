package preflight

import (
	"reflect"
	"testing"

	"github.com/cutover-dev/cutover/coordinator/internal/config"
	"github.com/cutover-dev/cutover/coordinator/internal/fleet"
	"github.com/cutover-dev/cutover/coordinator/internal/model"
	"github.com/cutover-dev/cutover/pkg/callstream"
	coordinatorv1 "github.com/cutover-dev/cutover/proto/coordinator/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestAsAtomicIsValidate: auto's pick of atomic turns the request
// validated as staged into what Validate makes of it with strategy atomic,
// without validating again; a field Validate comes to set by strategy
// breaks this test rather than the cutover.
func TestAsAtomicIsValidate(t *testing.T) {
	inv, err := model.NewInventory("test", []model.AgentSpec{
		{Node: "n3", Address: "198.18.0.3:9443"}, {Node: "n1", Address: "198.18.0.1:9443"}, {Node: "n2", Address: "198.18.0.2:9443"},
	})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(inv, nil, []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, callstream.Options{}, fleet.Clock{Parallel: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	c := New(config.Default(), fl, nil, nil)
	for _, req := range []*coordinatorv1.CutoverRequest{
		{Port: 4889, OperationId: "op1", Strategy: model.StrategyAuto},
		{Port: 4889, OperationId: "op2"}, // auto by the coordinator's default
		{Port: 31000, OperationId: "op3", Strategy: model.StrategyAuto, AllowNodeportRange: true, TimeoutMillis: 1500, AllowUnprobed: true, AllowPathProblems: true},
	} {
		auto, err := c.Validate(req)
		if err != nil || !auto.Auto || !auto.Staged {
			t.Fatalf("%s: %+v %v, want auto, validated as staged", req.OperationId, auto, err)
		}
		req.Strategy = model.StrategyAtomic
		want, err := c.Validate(req)
		if err != nil {
			t.Fatal(err)
		}
		got := auto.asAtomic()
		got.Auto, got.ByDefault = false, false // what auto adds
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: asAtomic\n  %+v\nValidate with strategy atomic\n  %+v", req.OperationId, got, want)
		}
	}
}
