package ovsdb

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// OVSDB values (RFC 7047 section 5.1) in Go:
//
//	string, int64, float64, bool  atoms (encoding also accepts any Go int/uint/float)
//	UUID                          ["uuid","<uuid>"]
//	NamedUUID                     ["named-uuid","<id>"]
//	Set                           ["set",[atom...]]
//	Map                           ["map",[[key,value]...]]
//
// Without the schema a JSON number is ambiguous: decoding makes numbers with
// a fraction or exponent float64 and all others int64, and encoding always
// writes a float64 with a fraction or exponent, so values round-trip.

// UUID is a row's permanent identifier.
type UUID string

// NamedUUID refers to a row inserted earlier in the same transaction.
type NamedUUID string

// Set is an OVSDB set of atoms. A one-element set may also arrive as a bare
// atom: use AsSet to read a set column whatever its encoding.
type Set []any

// Map is an OVSDB map; keys and values are atoms.
type Map map[any]any

// Row is a row's columns by name.
type Row map[string]any

// MarshalJSON implements json.Marshaler.
func (u UUID) MarshalJSON() ([]byte, error) { return appendValue(nil, u) }

// MarshalJSON implements json.Marshaler.
func (u NamedUUID) MarshalJSON() ([]byte, error) { return appendValue(nil, u) }

// MarshalJSON implements json.Marshaler.
func (s Set) MarshalJSON() ([]byte, error) { return appendValue(nil, s) }

// MarshalJSON implements json.Marshaler.
func (m Map) MarshalJSON() ([]byte, error) { return appendValue(nil, m) }

// MarshalJSON encodes each column with EncodeValue, in column order.
func (r Row) MarshalJSON() ([]byte, error) {
	cols := make([]string, 0, len(r))
	for c := range r {
		cols = append(cols, c)
	}
	sort.Strings(cols)
	b := []byte{'{'}
	for n, c := range cols {
		if n > 0 {
			b = append(b, ',')
		}
		b = appendString(b, c)
		b = append(b, ':')
		var err error
		if b, err = appendValue(b, r[c]); err != nil {
			return nil, fmt.Errorf("column %q: %w", c, err)
		}
	}
	return append(b, '}'), nil
}

// UnmarshalJSON decodes each column with DecodeValue.
func (r *Row) UnmarshalJSON(data []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return fmt.Errorf("row: %w", err)
	}
	out := make(Row, len(raw))
	for c, v := range raw {
		val, err := DecodeValue(v)
		if err != nil {
			return fmt.Errorf("row column %q: %w", c, err)
		}
		out[c] = val
	}
	*r = out
	return nil
}

// EncodeValue returns the OVSDB JSON encoding of v.
func EncodeValue(v any) ([]byte, error) { return appendValue(nil, v) }

func appendValue(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case Set:
		b = append(b, `["set",[`...)
		for n, a := range v {
			if n > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendAtom(b, a); err != nil {
				return nil, fmt.Errorf("set element %d: %w", n, err)
			}
		}
		return append(b, "]]"...), nil
	case Map:
		// Sorted by encoded key, so the same map always encodes the same
		// way (canonical text in tests and logs).
		type kv struct{ k, v []byte }
		pairs := make([]kv, 0, len(v))
		for k, val := range v {
			kb, err := appendAtom(nil, k)
			if err != nil {
				return nil, fmt.Errorf("map key %v: %w", k, err)
			}
			vb, err := appendAtom(nil, val)
			if err != nil {
				return nil, fmt.Errorf("map value for key %v: %w", k, err)
			}
			pairs = append(pairs, kv{kb, vb})
		}
		sort.Slice(pairs, func(i, j int) bool { return bytes.Compare(pairs[i].k, pairs[j].k) < 0 })
		b = append(b, `["map",[`...)
		for n, p := range pairs {
			if n > 0 {
				b = append(b, ',')
			}
			b = append(b, '[')
			b = append(b, p.k...)
			b = append(b, ',')
			b = append(b, p.v...)
			b = append(b, ']')
		}
		return append(b, "]]"...), nil
	default:
		return appendAtom(b, v)
	}
}

func appendAtom(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case string:
		return appendString(b, v), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int8:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int16:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case uint:
		return appendUint(b, uint64(v))
	case uint8:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint16:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10), nil
	case uint64:
		return appendUint(b, v)
	case float32:
		return appendReal(b, float64(v))
	case float64:
		return appendReal(b, v)
	case UUID:
		if !validUUID(string(v)) {
			return nil, fmt.Errorf("uuid %q: not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", string(v))
		}
		b = append(b, `["uuid",`...)
		return append(appendString(b, string(v)), ']'), nil
	case NamedUUID:
		if !validID(string(v)) {
			return nil, fmt.Errorf("named-uuid %q: must match [a-zA-Z_][a-zA-Z0-9_]*", string(v))
		}
		b = append(b, `["named-uuid",`...)
		return append(appendString(b, string(v)), ']'), nil
	case nil:
		return nil, fmt.Errorf("nil is not an OVSDB value (use an empty Set for an empty optional column)")
	default:
		return nil, fmt.Errorf("%T is not an OVSDB atom (want string, integer, real, bool, UUID or NamedUUID)", v)
	}
}

func appendUint(b []byte, v uint64) ([]byte, error) {
	if v > math.MaxInt64 {
		return nil, fmt.Errorf("integer %d: out of OVSDB's 64-bit signed range", v)
	}
	return strconv.AppendUint(b, v, 10), nil
}

func appendReal(b []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return nil, fmt.Errorf("real %v: JSON cannot carry NaN or infinity", f)
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0" // keep it a real when decoded again
	}
	return append(b, s...), nil
}

func appendString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // marshalling a string cannot fail
	return append(b, q...)
}

// DecodeValue decodes one OVSDB value (atom, set, map, uuid, named-uuid).
func DecodeValue(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("ovsdb value: %w", err)
	}
	if dec.More() {
		return nil, fmt.Errorf("ovsdb value: trailing data after the value")
	}
	return fromJSON(v)
}

// fromJSON converts a value decoded with UseNumber into its OVSDB Go form.
func fromJSON(v any) (any, error) {
	if arr, ok := v.([]any); ok {
		if len(arr) != 2 {
			return nil, fmt.Errorf("ovsdb value: array of %d elements, want [tag, payload]", len(arr))
		}
		tag, ok := arr[0].(string)
		if !ok {
			return nil, fmt.Errorf("ovsdb value: array tag %v is not a string", arr[0])
		}
		switch tag {
		case "set":
			elems, ok := arr[1].([]any)
			if !ok {
				return nil, fmt.Errorf("ovsdb set: payload is %T, want an array", arr[1])
			}
			s := make(Set, 0, len(elems))
			for n, e := range elems {
				a, err := atomFromJSON(e)
				if err != nil {
					return nil, fmt.Errorf("ovsdb set element %d: %w", n, err)
				}
				s = append(s, a)
			}
			return s, nil
		case "map":
			pairs, ok := arr[1].([]any)
			if !ok {
				return nil, fmt.Errorf("ovsdb map: payload is %T, want an array of pairs", arr[1])
			}
			m := make(Map, len(pairs))
			for n, p := range pairs {
				kv, ok := p.([]any)
				if !ok || len(kv) != 2 {
					return nil, fmt.Errorf("ovsdb map pair %d: want [key, value]", n)
				}
				k, err := atomFromJSON(kv[0])
				if err != nil {
					return nil, fmt.Errorf("ovsdb map pair %d key: %w", n, err)
				}
				val, err := atomFromJSON(kv[1])
				if err != nil {
					return nil, fmt.Errorf("ovsdb map pair %d value: %w", n, err)
				}
				if _, dup := m[k]; dup {
					return nil, fmt.Errorf("ovsdb map pair %d: duplicate key %v", n, k)
				}
				m[k] = val
			}
			return m, nil
		}
	}
	return atomFromJSON(v)
}

func atomFromJSON(v any) (any, error) {
	switch v := v.(type) {
	case string, bool:
		return v, nil
	case json.Number:
		s := string(v)
		if strings.ContainsAny(s, ".eE") {
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return nil, fmt.Errorf("real %s: %w", s, err)
			}
			return f, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("integer %s: out of 64-bit signed range", s)
		}
		return n, nil
	case []any:
		if len(v) == 2 {
			if tag, ok := v[0].(string); ok {
				s, ok := v[1].(string)
				switch {
				case tag == "uuid" && ok && validUUID(s):
					return UUID(s), nil
				case tag == "named-uuid" && ok && validID(s):
					return NamedUUID(s), nil
				case tag == "uuid" || tag == "named-uuid":
					return nil, fmt.Errorf("%s %v: malformed", tag, v[1])
				}
			}
		}
		return nil, fmt.Errorf("array %v is not an atom", v)
	case nil:
		return nil, fmt.Errorf("null is not an OVSDB value")
	default:
		return nil, fmt.Errorf("%T is not an OVSDB atom", v)
	}
}

func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !isHex(c) {
				return false
			}
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func validID(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// AsSet reads a set column: a Set as is, a bare atom as a one-element set.
func AsSet(v any) (Set, error) {
	switch v := v.(type) {
	case Set:
		return v, nil
	case Map, nil:
		return nil, fmt.Errorf("%T is not a set", v)
	default:
		return Set{v}, nil
	}
}

// AsMap reads a map column.
func AsMap(v any) (Map, error) {
	m, ok := v.(Map)
	if !ok {
		return nil, fmt.Errorf("%T is not a map", v)
	}
	return m, nil
}

// AsStringMap reads a string-to-string map column (options, external_ids).
func AsStringMap(v any) (map[string]string, error) {
	m, err := AsMap(v)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(m))
	for k, val := range m {
		ks, ok1 := k.(string)
		vs, ok2 := val.(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("map entry %v=%v: not string to string", k, val)
		}
		out[ks] = vs
	}
	return out, nil
}

// StringMap converts a Go string map to an OVSDB Map.
func StringMap(m map[string]string) Map {
	out := make(Map, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// AsInt reads an integer column; an optional integer (a set of zero or one)
// reports ok=false when empty.
func AsInt(v any) (n int64, ok bool, err error) {
	switch v := v.(type) {
	case int64:
		return v, true, nil
	case Set:
		switch len(v) {
		case 0:
			return 0, false, nil
		case 1:
			return AsInt(v[0])
		}
		return 0, false, fmt.Errorf("set of %d elements is not an integer", len(v))
	default:
		return 0, false, fmt.Errorf("%T is not an integer", v)
	}
}

// AsString reads a string column; an optional string reports ok=false when empty.
func AsString(v any) (s string, ok bool, err error) {
	switch v := v.(type) {
	case string:
		return v, true, nil
	case Set:
		switch len(v) {
		case 0:
			return "", false, nil
		case 1:
			return AsString(v[0])
		}
		return "", false, fmt.Errorf("set of %d elements is not a string", len(v))
	default:
		return "", false, fmt.Errorf("%T is not a string", v)
	}
}
