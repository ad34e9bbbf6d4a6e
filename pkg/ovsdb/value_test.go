package ovsdb

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
)

const u1 = "0d4a3ab5-0e0d-4b16-8f7a-2a3e7e0c9d11"

func TestValueRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{"br0", `"br0"`},
		{"quote\"and\\", `"quote\"and\\"`},
		{int64(4789), `4789`},
		{int64(-1), `-1`},
		{float64(1), `1.0`},
		{2.5, `2.5`},
		{1e300, `1e+300`},
		{true, `true`},
		{UUID(u1), `["uuid","` + u1 + `"]`},
		{NamedUUID("new_row"), `["named-uuid","new_row"]`},
		{Set{}, `["set",[]]`},
		{Set{"a", int64(2), UUID(u1)}, `["set",["a",2,["uuid","` + u1 + `"]]]`},
		{Map{}, `["map",[]]`},
		{Map{"remote_ip": "flow", "key": "flow", "dst_port": "4889"}, `["map",[["dst_port","4889"],["key","flow"],["remote_ip","flow"]]]`},
		{Map{int64(2): UUID(u1), int64(1): "x"}, `["map",[[1,"x"],[2,["uuid","` + u1 + `"]]]]`},
	} {
		got, err := EncodeValue(tc.v)
		if err != nil {
			t.Errorf("EncodeValue(%#v): %v", tc.v, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("EncodeValue(%#v) = %s, want %s", tc.v, got, tc.want)
		}
		back, err := DecodeValue(got)
		if err != nil {
			t.Errorf("DecodeValue(%s): %v", got, err)
			continue
		}
		if !reflect.DeepEqual(back, tc.v) {
			t.Errorf("round trip of %s = %#v, want %#v", got, back, tc.v)
		}
	}
}

func TestEncodeGoIntegers(t *testing.T) {
	for _, v := range []any{int(7), int8(7), int16(7), int32(7), uint(7), uint8(7), uint16(7), uint32(7), uint64(7)} {
		got, err := EncodeValue(v)
		if err != nil || string(got) != "7" {
			t.Errorf("EncodeValue(%T 7) = %s, %v", v, got, err)
		}
	}
}

func TestEncodeRejects(t *testing.T) {
	for _, tc := range []struct {
		v    any
		want string
	}{
		{nil, "nil"},
		{math.NaN(), "NaN"},
		{math.Inf(1), "infinity"},
		{uint64(math.MaxUint64), "out of"},
		{UUID("not-a-uuid"), "uuid"},
		{NamedUUID("1bad"), "named-uuid"},
		{Set{Set{"nested"}}, "set element 0"},
		{Map{"k": Map{}}, "map value"},
		{[]string{"x"}, "not an OVSDB atom"},
		{struct{}{}, "not an OVSDB atom"},
	} {
		_, err := EncodeValue(tc.v)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("EncodeValue(%#v) = %v, want error containing %q", tc.v, err, tc.want)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for _, in := range []string{
		``, `null`, `{}`, `[]`, `["set"]`, `["set","x"]`, `["set",[["set",[]]]]`,
		`["map",[["a"]]]`, `["map",[["a",1],["a",2]]]`, `["map",{}]`, `["uuid","zzz"]`,
		`["named-uuid","1x"]`, `["other",1]`, `[1,2]`, `99999999999999999999`, `1e999`,
		`"a" "b"`, `[`,
	} {
		if v, err := DecodeValue([]byte(in)); err == nil {
			t.Errorf("DecodeValue(%q) = %#v, want error", in, v)
		}
	}
}

func TestRowJSON(t *testing.T) {
	r := Row{"name": "vxlan0", "options": Map{"dst_port": "4789"}, "ofport": Set{}}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"vxlan0","ofport":["set",[]],"options":["map",[["dst_port","4789"]]]}`
	if string(data) != want {
		t.Fatalf("Row JSON = %s, want %s", data, want)
	}
	var back Row
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, r) {
		t.Fatalf("Row round trip = %#v, want %#v", back, r)
	}
	if err := json.Unmarshal([]byte(`{"x":null}`), &back); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("Row with null column: %v, want error naming the column", err)
	}
}

func TestAccessors(t *testing.T) {
	if n, ok, err := AsInt(int64(3)); n != 3 || !ok || err != nil {
		t.Errorf("AsInt(3) = %d %v %v", n, ok, err)
	}
	if _, ok, err := AsInt(Set{}); ok || err != nil {
		t.Errorf("AsInt(empty set) ok=%v err=%v, want absent", ok, err)
	}
	if n, ok, _ := AsInt(Set{int64(-1)}); n != -1 || !ok {
		t.Errorf("AsInt([-1]) = %d %v", n, ok)
	}
	if _, _, err := AsInt("x"); err == nil {
		t.Error("AsInt(string) succeeded")
	}
	if s, ok, _ := AsString(Set{"e"}); s != "e" || !ok {
		t.Errorf("AsString([e]) = %q %v", s, ok)
	}
	if _, ok, err := AsString(Set{}); ok || err != nil {
		t.Errorf("AsString(empty) = %v %v", ok, err)
	}
	if s, _ := AsSet("a"); !reflect.DeepEqual(s, Set{"a"}) {
		t.Errorf("AsSet(atom) = %#v", s)
	}
	m, err := AsStringMap(Map{"a": "b"})
	if err != nil || m["a"] != "b" {
		t.Errorf("AsStringMap = %v %v", m, err)
	}
	if _, err := AsStringMap(Map{"a": int64(1)}); err == nil {
		t.Error("AsStringMap with int value succeeded")
	}
	if !reflect.DeepEqual(StringMap(map[string]string{"a": "b"}), Map{"a": "b"}) {
		t.Error("StringMap")
	}
}

func TestOperationJSON(t *testing.T) {
	for _, tc := range []struct {
		op   Operation
		want string
	}{
		{Select("Interface", []Condition{Where("name", "==", "vxlan0")}, "options", "ofport"),
			`{"columns":["options","ofport"],"op":"select","table":"Interface","where":[["name","==","vxlan0"]]}`},
		{Select("Open_vSwitch", nil),
			`{"op":"select","table":"Open_vSwitch","where":[]}`},
		{Insert("Bridge", Row{"name": "br1"}, "nb"),
			`{"op":"insert","row":{"name":"br1"},"table":"Bridge","uuid-name":"nb"}`},
		{Update("Interface", []Condition{Where("_uuid", "==", UUID(u1))}, Row{"options": Map{"dst_port": "4889"}}),
			`{"op":"update","row":{"options":["map",[["dst_port","4889"]]]},"table":"Interface","where":[["_uuid","==",["uuid","` + u1 + `"]]]}`},
		{Mutate("Open_vSwitch", nil, Mut("next_cfg", "+=", 1)),
			`{"mutations":[["next_cfg","+=",1]],"op":"mutate","table":"Open_vSwitch","where":[]}`},
		{Wait("Interface", nil, []string{"options"}, "==", []Row{{"options": Map{}}}, 0),
			`{"columns":["options"],"op":"wait","rows":[{"options":["map",[]]}],"table":"Interface","timeout":0,"until":"==","where":[]}`},
		{Wait("Interface", nil, nil, "!=", nil, -1),
			`{"columns":[],"op":"wait","rows":[],"table":"Interface","until":"!=","where":[]}`},
		{Delete("Bridge", nil), `{"op":"delete","table":"Bridge","where":[]}`},
		{Comment("cutover op 7"), `{"comment":"cutover op 7","op":"comment"}`},
	} {
		got, err := json.Marshal(tc.op)
		if err != nil {
			t.Errorf("%s: %v", tc.op.Op, err)
			continue
		}
		if string(got) != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.op.Op, got, tc.want)
		}
	}
	for _, bad := range []Operation{
		{Op: "frobnicate"},
		Wait("T", nil, nil, "<", nil, 0),
		Insert("T", nil, "9bad"),
		Update("T", []Condition{Where("c", "==", nil)}, nil),
		Mutate("T", nil, Mut("c", "+=", math.NaN())),
	} {
		if _, err := json.Marshal(bad); err == nil {
			t.Errorf("Marshal(%+v) succeeded, want error", bad)
		}
	}
}
