package sluice

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
)

// The shared protocol vectors: every SDK runs all of them (protocol/README.md).
const vectorsPath = "../../protocol/vectors/session.json"

type vectorIdentity struct {
	Service  string  `json:"service"`
	Slice    string  `json:"slice"`
	Instance *string `json:"instance"`
	Token    *string `json:"token"`
}

// options maps the vector's identity to Options; null is "" in Go.
func (v vectorIdentity) options() Options {
	deref := func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	}
	return Options{Service: v.Service, Slice: v.Slice, Instance: deref(v.Instance), Token: deref(v.Token)}
}

type vectors struct {
	Registrations []struct {
		Name     string         `json:"name"`
		Identity vectorIdentity `json:"identity"`
		Capacity *int           `json:"capacity"`
		Streams  *int           `json:"streams"`
		Bytes    string         `json:"bytes"`
	} `json:"registrations"`
	Drains []struct {
		Name     string         `json:"name"`
		Identity vectorIdentity `json:"identity"`
		Bytes    string         `json:"bytes"`
	} `json:"drains"`
	Replies []struct {
		Name    string `json:"name"`
		Request string `json:"request"`
		Bytes   string `json:"bytes"`
		Expect  struct {
			Outcome   string `json:"outcome"`
			Rest      string `json:"rest"`
			Status    int    `json:"status"`
			Retryable bool   `json:"retryable"`
			Reason    string `json:"reason"`
		} `json:"expect"`
	} `json:"replies"`
	ClientAddresses []struct {
		Name   string   `json:"name"`
		Values []string `json:"values"`
		Client *string  `json:"client"`
	} `json:"client_addresses"`
	AppFields []struct {
		Name    string              `json:"name"`
		Request string              `json:"request"`
		Fields  map[string][]string `json:"fields"`
	} `json:"app_fields"`
	Options []struct {
		Name     string         `json:"name"`
		Identity vectorIdentity `json:"identity"`
		Valid    bool           `json:"valid"`
	} `json:"options"`
	Controls []struct {
		Name     string         `json:"name"`
		Identity vectorIdentity `json:"identity"`
		Capacity int            `json:"capacity"`
		Split    string         `json:"split"` // "" for a link without Sluice-Split
		Bytes    string         `json:"bytes"`
	} `json:"controls"`
	ControlReplies []struct {
		Name   string `json:"name"`
		Bytes  string `json:"bytes"`
		Expect struct {
			Outcome   string `json:"outcome"`
			Rest      string `json:"rest"`
			Status    int    `json:"status"`
			Retryable bool   `json:"retryable"`
		} `json:"expect"`
	} `json:"control_replies"`
	ControlLines []struct {
		From  string          `json:"from"`
		Line  string          `json:"line"`
		Parse json.RawMessage `json:"parse"`
	} `json:"control_lines"`
	Splits []struct {
		Name     string `json:"name"`
		Capacity int    `json:"capacity"`
		Nodes    []struct {
			Live   bool    `json:"live"`
			Demand float64 `json:"demand"`
			Held   int     `json:"held"`
			Floor  *bool   `json:"floor"` // absent: true
		} `json:"nodes"`
		Targets []int `json:"targets"`
		Quiet   bool  `json:"quiet"`
	} `json:"splits"`
	Addresses []struct {
		Name    string          `json:"name"`
		Address string          `json:"address"`
		Expect  json.RawMessage `json:"expect"`
	} `json:"addresses"`
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		t.Fatalf("the shared protocol vectors must be present: %v", err)
	}
	var v vectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("parse %s: %v", vectorsPath, err)
	}
	return v
}

// latin1 turns a vector byte string (every character below U+0100) into its bytes.
func latin1(t *testing.T, s string) []byte {
	t.Helper()
	out := make([]byte, 0, len(s))
	for _, r := range s {
		if r > 0xff {
			t.Fatalf("vector string has a character above U+00FF: %q", r)
		}
		out = append(out, byte(r))
	}
	return out
}

func TestVectorsRegistrations(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	ran, h2 := 0, 0
	for _, vec := range v.Registrations {
		o := vec.Identity.options()
		if vec.Streams != nil {
			// Through Options, as an application asks for HTTP/2 sessions.
			o.Streams = *vec.Streams
			h2++
		}
		o = o.withDefaults()
		if err := o.validateStreams(); err != nil {
			t.Errorf("%s: %v", vec.Name, err)
		}
		capacity := noCapacity
		if vec.Capacity != nil {
			capacity = *vec.Capacity
		}
		if got, want := encodeRegistration(o.identity(), capacity, o.Streams), latin1(t, vec.Bytes); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", vec.Name, got, want)
		}
		ran++
	}
	if ran == 0 || ran != len(v.Registrations) || h2 == 0 {
		t.Fatalf("ran %d of %d registration vectors (%d of HTTP/2 sessions)", ran, len(v.Registrations), h2)
	}
}

func TestVectorsDrains(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	ran := 0
	for _, vec := range v.Drains {
		o := vec.Identity.options().withDefaults()
		if got, want := encodeDrain(o.identity()), latin1(t, vec.Bytes); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %q\nwant %q", vec.Name, got, want)
		}
		ran++
	}
	if ran == 0 || ran != len(v.Drains) {
		t.Fatalf("ran %d of %d drain vectors", ran, len(v.Drains))
	}
}

func TestVectorsOptions(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	ran := 0
	for _, vec := range v.Options {
		o := vec.Identity.options()
		o.Acceptor = "127.0.0.1:1"
		_, err := Listen(t.Context(), o)
		if valid := err == nil; valid != vec.Valid {
			t.Errorf("%s: valid = %v, want %v (err: %v)", vec.Name, valid, vec.Valid, err)
		}
		if err != nil && !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("%s: error %v does not wrap ErrInvalidOptions", vec.Name, err)
		}
		// A valid identity would dial 127.0.0.1:1 in the background; validation is what counts.
		o = o.withDefaults()
		if valid := o.validate() == nil; valid != vec.Valid {
			t.Errorf("%s: validate = %v, want %v", vec.Name, valid, vec.Valid)
		}
		ran++
	}
	if ran == 0 || ran != len(v.Options) {
		t.Fatalf("ran %d of %d options vectors", ran, len(v.Options))
	}
}

// TestVectorsReplies feeds each answer from a fake acceptor over a real socket and checks what
// the dialer makes of it; for a session, everything read past the head reaches the reader.
func TestVectorsReplies(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	ran := 0
	for _, vec := range v.Replies {
		t.Run(vec.Name, func(t *testing.T) {
			addr := answerOnce(t, latin1(t, vec.Bytes))
			o := Options{Acceptor: addr, Service: "api", Slice: "default", HandshakeTimeout: defaultHandshakeTimeout}
			if vec.Request == "register-h2" {
				o.Streams = 8
			}
			d := newDialer(&o)
			var err error
			switch vec.Request {
			case "register", "register-h2":
				var conn net.Conn
				var rest []byte
				conn, rest, err = d.register(t.Context(), 1)
				if err == nil {
					c := newSessionConn(nil, conn, rest)
					defer c.Close()
					got, readErr := io.ReadAll(c)
					if readErr != nil || string(got) != string(latin1(t, vec.Expect.Rest)) {
						t.Errorf("session bytes %q (%v), want %q", got, readErr, vec.Expect.Rest)
					}
				}
			case "drain":
				err = d.drain(t.Context())
			default:
				t.Fatalf("unknown request %q", vec.Request)
			}
			checkOutcome(t, err, vec.Request, vec.Expect.Outcome, vec.Expect.Status, vec.Expect.Retryable)
			// An acceptor that switched without HTTP/2 says so (protocol/README.md "HTTP/2 sessions").
			if vec.Request == "register-h2" && vec.Expect.Outcome == "error" && !vec.Expect.Retryable &&
				(err == nil || !strings.Contains(err.Error(), "does not take HTTP/2 sessions")) {
				t.Errorf("error %v does not say that the acceptor does not take HTTP/2 sessions", err)
			}
			// The acceptor's reason is shown, not just its status.
			if vec.Expect.Reason != "" && (err == nil || !strings.Contains(err.Error(), vec.Expect.Reason)) {
				t.Errorf("error %v does not show the acceptor's reason %q", err, vec.Expect.Reason)
			}
		})
		ran++
	}
	if ran == 0 || ran != len(v.Replies) {
		t.Fatalf("ran %d of %d reply vectors", ran, len(v.Replies))
	}
}

func checkOutcome(t *testing.T, err error, request, outcome string, status int, retryable bool) {
	t.Helper()
	var e *Error
	switch outcome {
	case "session", "drained":
		if (outcome == "session") != strings.HasPrefix(request, "register") || err != nil {
			t.Fatalf("outcome %s: got error %v", outcome, err)
		}
	case "refused":
		if !errors.As(err, &e) || e.Kind != KindRefused || e.Status != status || e.Retryable() != retryable {
			t.Fatalf("want refused %d (retryable %v), got %#v", status, retryable, err)
		}
	case "error":
		if !errors.As(err, &e) || e.Kind == KindRefused || e.Retryable() != retryable {
			t.Fatalf("want a non-refusal error (retryable %v), got %#v", retryable, err)
		}
	default:
		t.Fatalf("unknown outcome %q", outcome)
	}
}

// answerOnce accepts one connection, reads the request head, writes answer and closes.
func answerOnce(t *testing.T, answer []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		if _, err := readHead(bufio.NewReader(conn)); err != nil {
			return
		}
		conn.Write(answer)
	}()
	return ln.Addr().String()
}

// readHead reads an HTTP head up to and including its blank line.
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		if err != nil {
			return head, err
		}
		if string(line) == "\r\n" {
			return head, nil
		}
	}
}

// TestVectorsClientAddresses: r.RemoteAddr as ln.Handler sets it for a request on a session
// with these Sluice-Client-Addr fields; without a trusted value it stays the session's peer.
func TestVectorsClientAddresses(t *testing.T) {
	v := loadVectors(t)
	if len(v.ClientAddresses) < 10 {
		t.Fatalf("only %d client address vectors", len(v.ClientAddresses))
	}
	const peer = "192.0.2.1:7070"
	for _, c := range v.ClientAddresses {
		t.Run(c.Name, func(t *testing.T) {
			conn := &sessionConn{}
			conn.addr = &sessionAddr{conn: conn}
			l := &Listener{log: slog.New(slog.DiscardHandler)}
			conn.l = l
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = peer
			for _, value := range c.Values {
				r.Header.Add(clientAddrHeader, value)
			}
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(conn.addr)))
			var got string
			l.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
				got = r.RemoteAddr
			})).ServeHTTP(httptest.NewRecorder(), r)
			want := peer
			if c.Client != nil {
				want = *c.Client
			}
			if got != want {
				t.Errorf("RemoteAddr %q, want %q", got, want)
			}
		})
	}
}

// TestVectorsAppFields writes each request on a registered session, as the proxy forwards a
// client's, to a handler behind an unchanged http.Server wrapped by ln.Handler: for every
// field the vector lists, r.Header.Values (which finds a name in any case) gives the values
// as sent, in order.
func TestVectorsAppFields(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)
	if len(v.AppFields) < 6 {
		t.Fatalf("only %d app field vectors", len(v.AppFields))
	}
	for _, c := range v.AppFields {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			f := tcpAcceptor(t)
			ln := listen(t, f, Options{})
			seen := make(chan http.Header, 1)
			serve(t, ln, func(_ http.ResponseWriter, r *http.Request) { seen <- r.Header.Clone() })
			s := f.session()
			waitUntil(t, ln, "registered", func(l *Listener) bool { return l.registered == 1 })
			if _, err := s.conn.Write(latin1(t, c.Request)); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(s.br, nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("response %v, %v", resp, err)
			}
			resp.Body.Close()
			header := <-seen
			for name, values := range c.Fields {
				var want []string
				for _, v := range values {
					want = append(want, string(latin1(t, v)))
				}
				if got := header.Values(name); !slices.Equal(got, want) {
					t.Errorf("%s: %q, want %q", name, got, want)
				}
			}
		})
	}
}
