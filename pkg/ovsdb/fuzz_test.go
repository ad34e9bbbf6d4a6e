package ovsdb

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodeValue: the value decoder never panics, and whatever it accepts
// encodes back to text that decodes to the same value.
func FuzzDecodeValue(f *testing.F) {
	for _, s := range []string{
		`"x"`, `0`, `-7`, `1.5`, `1e3`, `true`, `["uuid","` + u1 + `"]`, `["named-uuid","r1"]`,
		`["set",[]]`, `["set",[1,"a",false]]`, `["map",[["dst_port","4889"],["key","flow"]]]`,
		`["map",[[1,["uuid","` + u1 + `"]]]]`, `["set",[["set",[]]]]`, `[`, `null`, `{"a":1}`,
		`"\u0000\ud800"`, `-0`, `-0.0`, `123456789012345678901234567890`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := DecodeValue(data)
		if err != nil {
			return
		}
		enc, err := EncodeValue(v)
		if err != nil {
			t.Fatalf("decoded %q to %#v, which does not encode: %v", data, v, err)
		}
		back, err := DecodeValue(enc)
		if err != nil {
			t.Fatalf("re-decoding %s: %v", enc, err)
		}
		if !reflect.DeepEqual(back, v) {
			t.Fatalf("round trip %q -> %#v -> %s -> %#v", data, v, enc, back)
		}
	})
}

// FuzzDecodeTransactResult: any server answer yields results or a typed
// error, never a panic, and an error never comes with more results than ops.
func FuzzDecodeTransactResult(f *testing.F) {
	for _, s := range []string{
		`[{},{"count":1},{"count":1}]`,
		`[{"error":"timed out"},null,null]`,
		`[{},{"count":1},{"error":"constraint violation","details":"x"}]`,
		`[{},{"count":1},{"count":1},{"error":"referential integrity violation"}]`,
		`[{"rows":[{"name":"vxlan0","options":["map",[["dst_port","4789"]]],"ofport":1}]},{},{}]`,
		`[{"uuid":["uuid","` + u1 + `"]},{},{}]`,
		`[{"uuid":"bad"},{},{}]`, `[]`, `{}`, `[null,null,null]`, `[{"rows":[{"x":null}]},{},{}]`,
	} {
		f.Add([]byte(s))
	}
	ops := []Operation{Select("T", nil), Update("T", nil, Row{}), Mutate("T", nil)}
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := DecodeTransactResult(json.RawMessage(data), ops)
		if len(res) > len(ops) {
			t.Fatalf("%d results for %d ops", len(res), len(ops))
		}
		if err == nil && len(res) != len(ops) {
			t.Fatalf("success with %d results for %d ops", len(res), len(ops))
		}
		if err != nil {
			var oe *OpError
			var te *TransactError
			if !asAny(err, &oe, &te) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
		}
	})
}

// FuzzDispatch: the client's reader survives any byte stream: it either
// dispatches messages or closes the connection with ErrClosed.
func FuzzDispatch(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"result":[],"error":null}`,
		`{"id":null,"method":"update","params":["m",{"T":{"` + u1 + `":{"new":{"a":1}}}}]}`,
		`{"id":"e","method":"echo","params":[]}`,
		`{"id":"x","result":1}`, `{"method":"update","params":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m message
		if json.Unmarshal(data, &m) != nil {
			return
		}
		c := &Client{pending: map[uint64]chan response{}, monitors: map[string]*Monitor{}, done: make(chan struct{})}
		ch := make(chan response, 1)
		c.pending[1] = ch
		c.monitors["m"] = &Monitor{id: "m", c: c, notify: make(chan struct{}, 1)}
		switch m.Method {
		case "":
			_ = c.dispatch(&m) // requests would write to a nil conn
		case "update":
			c.deliverUpdate(m.Params)
		}
	})
}

func asAny(err error, oe **OpError, te **TransactError) bool {
	return errors.As(err, oe) || errors.As(err, te)
}
