package kubectl

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// forward opens a local port on 127.0.0.1 forwarded through the API server
// to port of pod (kubectl port-forward's way), and returns its address and
// how to stop it.
func forward(ctx context.Context, rc *rest.Config, cs kubernetes.Interface, pod *corev1.Pod, port int) (string, func(), error) {
	transport, upgrader, err := spdy.RoundTripperFor(rc)
	if err != nil {
		return "", nil, err
	}
	url := cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stopCh, readyCh := make(chan struct{}), make(chan struct{})
	var errOut bytes.Buffer
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stopCh, readyCh, nil, &errOut)
	if err != nil {
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	var once sync.Once
	stop := func() { once.Do(func() { close(stopCh) }) }
	select {
	case <-readyCh:
	case err := <-done:
		stop()
		return "", nil, fmt.Errorf("port-forward to coordinator pod %s/%s port %d through the API server: %w %s", pod.Namespace, pod.Name, port, err, strings.TrimSpace(errOut.String()))
	case <-ctx.Done():
		stop()
		return "", nil, fmt.Errorf("port-forward to coordinator pod %s/%s port %d: %w", pod.Namespace, pod.Name, port, ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		stop()
		return "", nil, fmt.Errorf("port-forward to %s/%s: %w", pod.Namespace, pod.Name, errOrNoPorts(err))
	}
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), stop, nil
}

func errOrNoPorts(err error) error {
	if err != nil {
		return err
	}
	return errNoPorts
}
