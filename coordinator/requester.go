package coordinator

import (
	"context"
	"fmt"

	"github.com/cutover-dev/cutover/pkg/pki"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// requestedByKey carries the original caller's identity when a follower
// forwards a request to the leader.
const requestedByKey = "cutover-requested-by"

// requester says who made the call of ctx: the client certificate's
// subject and role and the peer address, or "unauthenticated" without TLS.
// A call forwarded by another coordinator names the caller it forwarded.
func requester(ctx context.Context) string {
	from, who, role := "unknown address", "unauthenticated (no TLS)", ""
	if p, ok := peer.FromContext(ctx); ok {
		if p.Addr != nil {
			from = p.Addr.String()
		}
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
			leaf := ti.State.PeerCertificates[0]
			role, _ = pki.RoleOf(leaf)
			who = fmt.Sprintf("%+q (role %s, serial %s)", leaf.Subject.CommonName, role, leaf.SerialNumber)
		}
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && role == pki.RoleCoordinator {
		if v := md.Get(requestedByKey); len(v) > 0 && v[0] != "" {
			return v[0] + ", forwarded by coordinator " + who
		}
	}
	return who + " from " + from
}
