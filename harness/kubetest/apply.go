package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// ApplyOptions configure Apply.
type ApplyOptions struct {
	// DryRun asks the apiserver to run validation, defaulting and admission
	// but persist nothing (server-side dry run, "dryRun=All").
	DryRun bool
	// FieldManager defaults to "cutover-kubetest".
	FieldManager string
	// MappingTimeout bounds how long a kind unknown to the apiserver is
	// retried (a CRD applied earlier in the same stream takes a moment to
	// be served). Default 10 s.
	MappingTimeout time.Duration
}

// ObjectError is the apiserver's refusal of one object.
type ObjectError struct {
	Kind, Namespace, Name string
	Err                   error
}

func (e *ObjectError) Error() string {
	ns := e.Namespace
	if ns != "" {
		ns += "/"
	}
	return fmt.Sprintf("%s %s%s: %v", e.Kind, ns, e.Name, e.Err)
}

func (e *ObjectError) Unwrap() error { return e.Err }

// DecodeYAML splits a multi-document YAML (or JSON) stream into objects,
// skipping empty documents.
func DecodeYAML(data []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for i := 0; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("kubetest: YAML document %d: %w", i, err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// Apply server-side-applies every object of a multi-document YAML stream, in
// order, as the admin. It carries on past a refused object and returns every
// refusal (each an *ObjectError) joined, so one run names all the problems.
// Namespaced objects without a namespace go to "default".
func (c *Cluster) Apply(ctx context.Context, data []byte, o ApplyOptions) error {
	objs, err := DecodeYAML(data)
	if err != nil {
		return err
	}
	if o.FieldManager == "" {
		o.FieldManager = "cutover-kubetest"
	}
	if o.MappingTimeout == 0 {
		o.MappingTimeout = 10 * time.Second
	}
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return err
	}
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	var errs []error
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		oerr := &ObjectError{Kind: gvk.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName()}
		var mapping *meta.RESTMapping
		deadline := time.Now().Add(o.MappingTimeout)
		for {
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err == nil || !meta.IsNoMatchError(err) || time.Now().After(deadline) {
				break
			}
			mapper.Reset()
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			oerr.Err = fmt.Errorf("apiVersion %s: kind not served by the apiserver (CRD not installed?): %w", gvk.GroupVersion(), err)
			errs = append(errs, oerr)
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			if obj.GetNamespace() == "" {
				obj.SetNamespace("default")
				oerr.Namespace = "default"
			}
			ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		body, err := obj.MarshalJSON()
		if err != nil {
			oerr.Err = err
			errs = append(errs, oerr)
			continue
		}
		force := true
		po := metav1.PatchOptions{FieldManager: o.FieldManager, Force: &force}
		if o.DryRun {
			po.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, body, po); err != nil {
			oerr.Err = err
			errs = append(errs, oerr)
		}
	}
	return errors.Join(errs...)
}

// Kustomize renders the kustomization in dir with the pinned kustomize
// (gated by RequireKustomize) and returns the YAML stream.
func Kustomize(t testing.TB, dir string) []byte {
	t.Helper()
	RequireKustomize(t)
	out, err := RunKustomize(dir)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// RunKustomize runs `kustomize build dir` with the pinned binary.
func RunKustomize(dir string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(KustomizePath(), "build", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("kubetest: %s build %s: %w: %s", KustomizePath(), dir, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}
