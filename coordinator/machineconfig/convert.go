package machineconfig

import "k8s.io/apimachinery/pkg/runtime"

// runtimeConvert fills a typed object from an unstructured map.
func runtimeConvert(m map[string]any, into any) error {
	return runtime.DefaultUnstructuredConverter.FromUnstructured(m, into)
}
