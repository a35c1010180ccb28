package sluice

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Tests against the real proxy: the `sluice` binary, built by cargo once per run (as the
// Python SDK's tests build it) into $CARGO_TARGET_DIR or the repository's target/, or the one
// $SLUICE_BIN names. They are skipped with -short.

const repoRoot = "../.."

var (
	buildOnce  sync.Once
	sluicePath string
	buildErr   error
)

func sluiceBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the real sluice binary (not with -short)")
	}
	buildOnce.Do(func() {
		if bin := os.Getenv("SLUICE_BIN"); bin != "" {
			sluicePath, buildErr = filepath.Abs(bin) // a binary built elsewhere
			return
		}
		cmd := exec.Command("cargo", "build", "--locked", "--quiet", "-p", "sluice-cli", "--bin", "sluice")
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		if err != nil {
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

// sluiceToken opens the test configs' reverse cluster.
const sluiceToken = "go-s3cret"

// sluiceConfig is a node: listener, acceptor and admin API on ip (port 0 unless given), one
// reverse cluster "api" that queues, with extra lines for the cluster.
func sluiceConfig(ip string, acceptorPort int, cluster ...string) string {
	return fmt.Sprintf(`
[acceptor]
listen = "%[1]s:%[2]d"
handshakes_per_second = 0

[admin]
listen = "%[1]s:0"

[[listener]]
name = "public"
listen = "%[1]s:0"

[[route]]
cluster = "api"

[cluster.api]
kind = "reverse"
tokens = ["env:GO_SDK_TOKEN"]
queue_max = 4096
queue_timeout = "20s"
`, ip, acceptorPort) + strings.Join(cluster, "\n") + "\n"
}

// sluiceNode is one running `sluice run`, watched through its JSON log lines.
type sluiceNode struct {
	t    *testing.T
	cmd  *exec.Cmd
	HTTP string // the listener
	// Acceptor and Admin are the addresses services and operators use.
	Acceptor, Admin string

	mu     sync.Mutex
	lines  []string
	exited bool
	more   chan struct{} // closed and replaced when a line arrives or the process exits
}

// startSluice runs `sluice run` with config in a temp dir and args (such as --upgrade); it is
// stopped at cleanup.
func startSluice(t *testing.T, config string, args ...string) *sluiceNode {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sluice.toml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sluiceBinary(t), append([]string{"run", "-c", path, "--log-format", "json"}, args...)...)
	cmd.Env = append(os.Environ(), "GO_SDK_TOKEN="+sluiceToken, "RUST_LOG=info")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &sluiceNode{t: t, cmd: cmd, more: make(chan struct{})}
	go n.read(bufio.NewScanner(out))
	t.Cleanup(n.kill)
	n.HTTP = n.field("listening", "addr")
	n.Acceptor = strings.TrimSuffix(strings.TrimPrefix(n.field("acceptor running", "acceptor.addr"), "Some("), ")")
	n.Admin = n.field("admin API listening", "admin.addr")
	return n
}

func (n *sluiceNode) read(sc *bufio.Scanner) {
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

// waitLine returns the first line (past or future) for which pred holds.
func (n *sluiceNode) waitLine(what string, pred func(string) bool) string {
	n.t.Helper()
	deadline := time.After(testDeadline)
	for i := 0; ; {
		n.mu.Lock()
		lines, exited, more := n.lines, n.exited, n.more
		n.mu.Unlock()
		for ; i < len(lines); i++ {
			if pred(lines[i]) {
				return lines[i]
			}
		}
		if exited {
			n.t.Fatalf("sluice exited before %s:\n%s", what, strings.Join(lines, "\n"))
		}
		select {
		case <-more:
		case <-deadline:
			n.t.Fatalf("sluice: no %s:\n%s", what, strings.Join(lines, "\n"))
		}
	}
}

// field is a field of the first log line with message.
func (n *sluiceNode) field(message, key string) string {
	n.t.Helper()
	line := n.waitLine(fmt.Sprintf("%q log line", message), func(l string) bool {
		return strings.Contains(l, `"message":"`+message+`"`)
	})
	var parsed struct {
		Fields map[string]any `json:"fields"`
	}
	if err := json.Unmarshal([]byte(line), &parsed); err != nil {
		n.t.Fatalf("log line %q: %v", line, err)
	}
	return fmt.Sprint(parsed.Fields[key])
}

// admin POSTs to the admin API and returns the status.
func (n *sluiceNode) admin(path string) int {
	n.t.Helper()
	resp, err := http.Post("http://"+n.Admin+path, "text/plain", nil)
	if err != nil {
		n.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// stop sends SIGTERM (a graceful stop: the node says DRAINING on its control links) and waits.
func (n *sluiceNode) stop() {
	n.t.Helper()
	n.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- n.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(testDeadline):
		n.cmd.Process.Kill()
		<-done
		n.t.Error("sluice did not stop on SIGTERM")
	}
}

// waitExit waits until the process has ended by itself (the old one of a hot restart).
func (n *sluiceNode) waitExit() {
	n.t.Helper()
	deadline := time.After(testDeadline)
	for {
		n.mu.Lock()
		exited, more := n.exited, n.more
		n.mu.Unlock()
		if exited {
			return
		}
		select {
		case <-more:
		case <-deadline:
			n.t.Fatal("sluice did not exit")
		}
	}
}

// kill ends the process at once (a crash), if it still runs.
func (n *sluiceNode) kill() {
	if n.cmd.ProcessState == nil {
		n.cmd.Process.Kill()
		n.cmd.Wait()
	}
}
