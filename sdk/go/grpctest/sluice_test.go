package grpctest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

// testDeadline turns a hang into a failure; no test asserts a duration near it.
const testDeadline = 30 * time.Second

const repoRoot = "../../.."

var (
	buildOnce  sync.Once
	sluicePath string
	buildErr   error
)

// sluiceBinary is $SLUICE_BIN, or cargo's debug build of the repository's sluice.
func sluiceBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if bin := os.Getenv("SLUICE_BIN"); bin != "" {
			sluicePath, buildErr = filepath.Abs(bin)
			return
		}
		cmd := exec.Command("cargo", "build", "--locked", "--quiet", "-p", "sluice-cli", "--bin", "sluice")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("cargo build: %v\n%s", err, out)
			return
		}
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			target = filepath.Join(repoRoot, "target")
		}
		sluicePath, buildErr = filepath.Abs(filepath.Join(target, "debug", "sluice"))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return sluicePath
}

const token = "grpc-s3cret"

// config is one node on 127.0.0.1 (ports chosen by the kernel) with one reverse cluster
// "api" that every route reaches and whose queue holds requests while every stream is busy.
const config = `
[acceptor]
listen = "127.0.0.1:0"
handshakes_per_second = 0

[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
cluster = "api"

[cluster.api]
kind = "reverse"
tokens = ["env:GRPC_TEST_TOKEN"]
queue_max = 4096
queue_timeout = "20s"
no_sessions_wait = "10s"
`

// node is one running `sluice run`, watched through its JSON log lines.
type node struct {
	t   *testing.T
	cmd *exec.Cmd
	// HTTP is the listener clients call; Acceptor is where services dial in.
	HTTP, Acceptor string

	mu     sync.Mutex
	lines  []string
	exited bool
	more   chan struct{}
}

// startSluice runs `sluice run` with config in a temp dir; it is killed at cleanup, failed
// test or not.
func startSluice(t *testing.T) *node {
	return startSluiceWith(t, config)
}

// startSluiceWith runs `sluice run` with cfg; Acceptor is set when cfg has one.
func startSluiceWith(t *testing.T, cfg string) *node {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sluiceBinary(t), "run", "-c", path, "--log-format", "json")
	cmd.Env = append(os.Environ(), "GRPC_TEST_TOKEN="+token, "RUST_LOG=info")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &node{t: t, cmd: cmd, more: make(chan struct{})}
	go n.read(bufio.NewScanner(out))
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			n.mu.Lock()
			t.Logf("sluice's log:\n%s", strings.Join(n.lines, "\n"))
			n.mu.Unlock()
		}
	})
	n.HTTP = n.field("listening", "addr")
	if strings.Contains(cfg, "[acceptor]") {
		n.Acceptor = strings.TrimSuffix(strings.TrimPrefix(n.field("acceptor running", "acceptor.addr"), "Some("), ")")
	}
	return n
}

func (n *node) read(sc *bufio.Scanner) {
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		n.mu.Lock()
		n.lines = append(n.lines, sc.Text())
		close(n.more)
		n.more = make(chan struct{})
		n.mu.Unlock()
	}
	n.mu.Lock()
	n.exited = true
	close(n.more)
	n.more = make(chan struct{})
	n.mu.Unlock()
}

// field is a field of the first log line with message.
func (n *node) field(message, key string) string {
	n.t.Helper()
	deadline := time.After(testDeadline)
	for i := 0; ; {
		n.mu.Lock()
		lines, exited, more := n.lines, n.exited, n.more
		n.mu.Unlock()
		for ; i < len(lines); i++ {
			if !strings.Contains(lines[i], `"message":"`+message+`"`) {
				continue
			}
			var parsed struct {
				Fields map[string]any `json:"fields"`
			}
			if err := json.Unmarshal([]byte(lines[i]), &parsed); err != nil {
				n.t.Fatalf("log line %q: %v", lines[i], err)
			}
			return fmt.Sprint(parsed.Fields[key])
		}
		if exited {
			n.t.Fatalf("sluice exited before %q:\n%s", message, strings.Join(lines, "\n"))
		}
		select {
		case <-more:
		case <-deadline:
			n.t.Fatalf("sluice: no %q log line:\n%s", message, strings.Join(lines, "\n"))
		}
	}
}

// listen registers capacity HTTP/2 sessions of streams streams each with n, starts serve on
// the Listener and waits until all are registered; the test's end closes them at once
// (t.Context ends before cleanups). Sluice leases a session once it has started its HTTP/2
// client on it, just after the 101 the SDK counts: serve runs first, and the config's
// no_sessions_wait covers the moment between.
func listen(t *testing.T, n *node, capacity, streams int, serve func(*sluice.Listener)) *sluice.Listener {
	t.Helper()
	ln, err := sluice.Listen(t.Context(), sluice.Options{
		Acceptor: n.Acceptor,
		Service:  "api",
		Instance: t.Name(),
		Token:    token,
		Capacity: capacity,
		Streams:  streams,
		Backoff:  sluice.Backoff{Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	serve(ln)
	deadline := time.After(testDeadline)
	for {
		st, changed := ln.Watch()
		if st.Registered == capacity {
			return ln
		}
		if st.LastError != nil && !sluice.IsRetryable(st.LastError) {
			t.Fatalf("registration stopped: %v", st.LastError)
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%d of %d sessions registered; last error: %v", st.Registered, capacity, st.LastError)
		}
	}
}
