// Package h2tap records what a client writes and reads on a connection
// and counts the HTTP/2 frames in it: how tests check what a gRPC
// connection carries beside its calls (pkg/callstream.DialOptions).
package h2tap

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"golang.org/x/net/http2"
)

// Conn is a client's net.Conn that records both directions.
type Conn struct {
	net.Conn
	mu          sync.Mutex
	wrote, read bytes.Buffer
}

// New records what passes through c.
func New(c net.Conn) *Conn { return &Conn{Conn: c} }

func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.wrote.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

// Mark is how much each direction has carried so far.
type Mark struct{ wrote, read int }

// Mark returns where each direction is now: Since counts from there.
func (c *Conn) Mark() Mark {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Mark{c.wrote.Len(), c.read.Len()}
}

// Since counts the frames the client sent and those it received after m,
// by type. m must fall between frames (a mark taken while the connection
// is quiet).
func (c *Conn) Since(m Mark) (sent, received map[http2.FrameType]int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if sent, err = Frames(c.wrote.Bytes()[m.wrote:]); err != nil {
		return nil, nil, fmt.Errorf("sent: %w", err)
	}
	if received, err = Frames(c.read.Bytes()[m.read:]); err != nil {
		return nil, nil, fmt.Errorf("received: %w", err)
	}
	return sent, received, nil
}

// Frames counts the HTTP/2 frames in b by type, a client's preface
// skipped; a frame cut at b's end is not counted.
func Frames(b []byte) (map[http2.FrameType]int, error) {
	b = bytes.TrimPrefix(b, []byte(http2.ClientPreface))
	fr := http2.NewFramer(nil, bytes.NewReader(b))
	fr.SetMaxReadFrameSize(1 << 24)
	out := map[http2.FrameType]int{}
	for {
		f, err := fr.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out[f.Header().Type]++
	}
}
