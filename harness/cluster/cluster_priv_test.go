package cluster

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestUpSmoke brings a cluster up with only a pause image and checks
// every node registers Ready with its address.
func TestUpSmoke(t *testing.T) {
	Require(t)
	pause := os.Getenv("COT_PAUSE_TAR")
	if pause == "" {
		t.Skip("COT_PAUSE_TAR not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c, err := Up(ctx, Config{Name: "cotst", Dir: t.TempDir(), Images: []string{pause}, PauseImage: "registry.k8s.io/pause:3.10", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Down(); err != nil {
			t.Error(err)
		}
	}()
	out, err := c.Kubectl(ctx, "get", "nodes", "-o", "wide")
	t.Log(out)
	if err != nil {
		t.Fatal(err)
	}
}
