package ovsdb

import (
	"encoding/json"
	"fmt"
)

// Operation is one element of a transact's params (RFC 7047 section 5.2).
// Build it with Select, Insert, Update, Mutate, Delete, Wait or Comment:
// each op carries exactly the members the RFC requires for it.
type Operation struct {
	Op        string
	Table     string
	Where     []Condition
	Row       Row
	Rows      []Row
	Columns   []string
	Mutations []Mutation
	UUIDName  string
	Until     string // wait: "==" or "!="
	Timeout   *int   // wait: milliseconds; nil waits forever
	Comment   string
}

// Condition is [column, function, value]: function is one of
// "<", "<=", "==", "!=", ">=", ">", "includes", "excludes".
type Condition struct {
	Column, Function string
	Value            any
}

// Mutation is [column, mutator, value]: mutator is one of
// "+=", "-=", "*=", "/=", "%=", "insert", "delete".
type Mutation struct {
	Column, Mutator string
	Value           any
}

// Where builds a condition.
func Where(column, function string, value any) Condition {
	return Condition{Column: column, Function: function, Value: value}
}

// Mut builds a mutation.
func Mut(column, mutator string, value any) Mutation {
	return Mutation{Column: column, Mutator: mutator, Value: value}
}

// Select returns the given columns (all when none) of rows matching where.
func Select(table string, where []Condition, columns ...string) Operation {
	return Operation{Op: "select", Table: table, Where: where, Columns: columns}
}

// Insert adds row; uuidName (optional) names it for later ops in the transaction.
func Insert(table string, row Row, uuidName string) Operation {
	return Operation{Op: "insert", Table: table, Row: row, UUIDName: uuidName}
}

// Update sets row's columns in every row matching where.
func Update(table string, where []Condition, row Row) Operation {
	return Operation{Op: "update", Table: table, Where: where, Row: row}
}

// Mutate applies mutations to every row matching where.
func Mutate(table string, where []Condition, mutations ...Mutation) Operation {
	return Operation{Op: "mutate", Table: table, Where: where, Mutations: mutations}
}

// Delete removes every row matching where.
func Delete(table string, where []Condition) Operation {
	return Operation{Op: "delete", Table: table, Where: where}
}

// Wait blocks the transaction until the rows matching where, projected on
// columns, are (until "==") or are not (until "!=") exactly rows, or fails
// it with "timed out" after timeoutMS (0: fail at once; negative: no timeout).
func Wait(table string, where []Condition, columns []string, until string, rows []Row, timeoutMS int) Operation {
	op := Operation{Op: "wait", Table: table, Where: where, Columns: columns, Until: until, Rows: rows}
	if timeoutMS >= 0 {
		t := timeoutMS
		op.Timeout = &t
	}
	return op
}

// Comment records text in the database log with the transaction.
func Comment(text string) Operation { return Operation{Op: "comment", Comment: text} }

// MarshalJSON implements json.Marshaler.
func (c Condition) MarshalJSON() ([]byte, error) {
	v, err := EncodeValue(c.Value)
	if err != nil {
		return nil, fmt.Errorf("condition on %q: %w", c.Column, err)
	}
	return json.Marshal([]any{c.Column, c.Function, json.RawMessage(v)})
}

// MarshalJSON implements json.Marshaler.
func (m Mutation) MarshalJSON() ([]byte, error) {
	v, err := EncodeValue(m.Value)
	if err != nil {
		return nil, fmt.Errorf("mutation of %q: %w", m.Column, err)
	}
	return json.Marshal([]any{m.Column, m.Mutator, json.RawMessage(v)})
}

// MarshalJSON writes the members the RFC defines for the op, and a where
// of [] rather than none: ovsdb-server requires "where" to be present.
func (o Operation) MarshalJSON() ([]byte, error) {
	m := map[string]any{"op": o.Op}
	where := o.Where
	if where == nil {
		where = []Condition{}
	}
	switch o.Op {
	case "select":
		m["table"], m["where"] = o.Table, where
		if len(o.Columns) > 0 {
			m["columns"] = o.Columns
		}
	case "insert":
		m["table"], m["row"] = o.Table, rowOrEmpty(o.Row)
		if o.UUIDName != "" {
			if !validID(o.UUIDName) {
				return nil, fmt.Errorf("insert into %s: uuid-name %q must match [a-zA-Z_][a-zA-Z0-9_]*", o.Table, o.UUIDName)
			}
			m["uuid-name"] = o.UUIDName
		}
	case "update":
		m["table"], m["where"], m["row"] = o.Table, where, rowOrEmpty(o.Row)
	case "mutate":
		muts := o.Mutations
		if muts == nil {
			muts = []Mutation{}
		}
		m["table"], m["where"], m["mutations"] = o.Table, where, muts
	case "delete":
		m["table"], m["where"] = o.Table, where
	case "wait":
		if o.Until != "==" && o.Until != "!=" {
			return nil, fmt.Errorf("wait on %s: until %q must be \"==\" or \"!=\"", o.Table, o.Until)
		}
		rows := o.Rows
		if rows == nil {
			rows = []Row{}
		}
		cols := o.Columns
		if cols == nil {
			cols = []string{}
		}
		m["table"], m["where"], m["columns"], m["until"], m["rows"] = o.Table, where, cols, o.Until, rows
		if o.Timeout != nil {
			m["timeout"] = *o.Timeout
		}
	case "comment":
		m["comment"] = o.Comment
	case "commit", "abort", "assert":
		// Rarely used ops: pass through what a caller set.
	default:
		return nil, fmt.Errorf("operation %q: unknown op (want select, insert, update, mutate, delete, wait or comment)", o.Op)
	}
	return json.Marshal(m)
}

func rowOrEmpty(r Row) Row {
	if r == nil {
		return Row{}
	}
	return r
}

// OpResult is one element of a transact's result.
type OpResult struct {
	Count int   // update, mutate, delete: rows affected
	UUID  UUID  // insert: the new row
	Rows  []Row // select: the rows
}
