package sluice

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// The vectors of many nodes: the control link's request and replies, its lines, the split and
// the acceptor addresses.

func TestVectorsControls(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	for _, vec := range v.Controls {
		o := vec.Identity.options().withDefaults()
		if got, want := encodeControl(o.identity(), vec.Capacity, vec.Split), latin1(t, vec.Bytes); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", vec.Name, got, want)
		}
	}
	if len(v.Controls) == 0 {
		t.Fatal("no control vectors")
	}
}

// TestVectorsControlReplies feeds each answer from a fake node over a real socket.
func TestVectorsControlReplies(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	if len(v.ControlReplies) == 0 {
		t.Fatal("no control reply vectors")
	}
	for _, vec := range v.ControlReplies {
		t.Run(vec.Name, func(t *testing.T) {
			addr := answerOnce(t, latin1(t, vec.Bytes))
			d := newDialer(&Options{Acceptor: addr, Service: "api", Slice: "default", HandshakeTimeout: defaultHandshakeTimeout})
			conn, rest, err := d.control(t.Context(), 4)
			var e *Error
			switch want := vec.Expect; want.Outcome {
			case "control":
				if err != nil {
					t.Fatalf("want a link, got %v", err)
				}
				defer conn.Close()
				if string(rest) != string(latin1(t, want.Rest)) {
					t.Errorf("rest %q, want %q", rest, want.Rest)
				}
			case "unsupported":
				if !errors.Is(err, errNoControl) {
					t.Errorf("want errNoControl, got %v", err)
				}
			case "refused":
				if !errors.As(err, &e) || e.Kind != KindRefused || e.Status != want.Status || e.Retryable() != want.Retryable {
					t.Errorf("want refused %d (retryable %v), got %#v", want.Status, want.Retryable, err)
				}
			case "error":
				if !errors.As(err, &e) || e.Kind == KindRefused || e.Retryable() != want.Retryable {
					t.Errorf("want a non-refusal error (retryable %v), got %#v", want.Retryable, err)
				}
			default:
				t.Fatalf("unknown outcome %q", want.Outcome)
			}
		})
	}
}

// TestVectorsControlLines reads the node's lines as the SDK does; the service's lines are
// checked against what the SDK writes and what the fake node in these tests reads.
func TestVectorsControlLines(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	ran := 0
	for _, vec := range v.ControlLines {
		var want struct {
			Demand *struct {
				InFlight uint64 `json:"in_flight"`
				Queued   uint64 `json:"queued"`
				Refused  uint64 `json:"refused"`
				Sessions uint64 `json:"sessions"`
			} `json:"demand"`
			Draining bool  `json:"draining"`
			Floor    *bool `json:"floor"`
			Retire   *int  `json:"retire"`
			Capacity *int  `json:"capacity"`
		}
		invalid := string(vec.Parse) == `"invalid"`
		if !invalid {
			if err := json.Unmarshal(vec.Parse, &want); err != nil {
				t.Fatalf("%q: %v", vec.Line, err)
			}
		}
		var got string
		switch vec.From {
		case "node":
			line, err := parseNodeLine(vec.Line)
			got = fmt.Sprint(line, err == nil)
			switch {
			case invalid:
				if err == nil || !errors.Is(err, errInvalidLine) {
					t.Errorf("%q: parsed as %+v, want invalid", vec.Line, line)
				}
			case want.Draining:
				if err != nil || line.verb != verbDraining {
					t.Errorf("%q: %s, want DRAINING", vec.Line, got)
				}
			case want.Floor != nil:
				if err != nil || line.verb != verbFloor || line.floor != *want.Floor {
					t.Errorf("%q: %s, want FLOOR %v", vec.Line, got, *want.Floor)
				}
			case want.Demand != nil:
				d := want.Demand
				if err != nil || line.verb != verbDemand || line.demand != (demand{d.InFlight, d.Queued, d.Refused, d.Sessions}) {
					t.Errorf("%q: %s, want %+v", vec.Line, got, *d)
				}
			default:
				t.Fatalf("%q: a parse this test does not know: %s", vec.Line, vec.Parse)
			}
		case "service":
			kind, n, err := parseServiceLine(vec.Line)
			switch {
			case invalid:
				if err == nil {
					t.Errorf("%q: parsed as %s %d, want invalid", vec.Line, kind, n)
				}
			case want.Retire != nil:
				if err != nil || kind != "RETIRE" || n != *want.Retire || retireLine(n) != vec.Line+"\n" {
					t.Errorf("%q: %s %d %v, want RETIRE %d", vec.Line, kind, n, err, *want.Retire)
				}
			case want.Capacity != nil:
				if err != nil || kind != "CAPACITY" || n != *want.Capacity || capacityLine(n) != vec.Line+"\n" {
					t.Errorf("%q: %s %d %v, want CAPACITY %d", vec.Line, kind, n, err, *want.Capacity)
				}
			}
		default:
			t.Fatalf("unknown from %q", vec.From)
		}
		ran++
	}
	if ran == 0 {
		t.Fatal("no control line vectors")
	}
}

// parseServiceLine reads a line from a service (RETIRE n ≥ 1, CAPACITY n), as a node does;
// the fake node of these tests uses it.
func parseServiceLine(line string) (string, int, error) {
	words, err := lineWords(line)
	if err != nil || len(words) != 2 {
		return "", 0, errInvalidLine
	}
	n, err := lineNumber(words[1])
	switch {
	case err != nil:
		return "", 0, errInvalidLine
	case words[0] == "RETIRE" && n >= 1, words[0] == "CAPACITY":
		return words[0], int(n), nil
	}
	return "", 0, errInvalidLine
}

func TestVectorsSplits(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	for _, vec := range v.Splits {
		views := make([]nodeView, len(vec.Nodes))
		for i, n := range vec.Nodes {
			views[i] = nodeView{live: n.Live, floor: n.Floor == nil || *n.Floor, demand: n.Demand, held: n.Held}
		}
		if got, _ := targets(vec.Capacity, views, true, vec.Quiet); !slices.Equal(got, vec.Targets) {
			t.Errorf("%s: targets %v, want %v", vec.Name, got, vec.Targets)
		}
	}
	if len(v.Splits) == 0 {
		t.Fatal("no split vectors")
	}
}

func TestVectorsAddresses(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	for _, vec := range v.Addresses {
		var want struct {
			Single *string `json:"single"`
			DNS    *struct {
				Name string `json:"name"`
				Port int    `json:"port"`
			} `json:"dns"`
			List []string `json:"list"`
		}
		invalid := string(vec.Expect) == `"invalid"`
		if !invalid {
			if err := json.Unmarshal(vec.Expect, &want); err != nil {
				t.Fatalf("%s: %v", vec.Name, err)
			}
		}
		a, err := parseAddress(vec.Address)
		switch {
		case invalid:
			if err == nil {
				t.Errorf("%s: %q parsed as %+v, want invalid", vec.Name, vec.Address, a)
			}
		case err != nil:
			t.Errorf("%s: %q: %v", vec.Name, vec.Address, err)
		case want.Single != nil:
			if a.kind != addrSingle || !slices.Equal(a.entries, []string{*want.Single}) {
				t.Errorf("%s: %+v, want single %q", vec.Name, a, *want.Single)
			}
		case want.DNS != nil:
			if a.kind != addrDNS || !slices.Equal(a.entries, []string{fmt.Sprintf("%s:%d", want.DNS.Name, want.DNS.Port)}) {
				t.Errorf("%s: %+v, want dns %+v", vec.Name, a, *want.DNS)
			}
		default:
			if a.kind != addrList || !slices.Equal(a.entries, want.List) {
				t.Errorf("%s: %+v, want list %q", vec.Name, a, want.List)
			}
		}
		// Listen agrees: what parses is accepted, what does not is refused before any dial.
		o := Options{Acceptor: vec.Address, Service: "api"}.withDefaults()
		if valid := o.validate() == nil; valid == invalid {
			t.Errorf("%s: Listen would accept %q: %v, want %v", vec.Name, vec.Address, valid, !invalid)
		}
	}
	if len(v.Addresses) == 0 {
		t.Fatal("no address vectors")
	}
}
