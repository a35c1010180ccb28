package promcheck

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/textparse"
)

// The Accept headers Prometheus sends: 3.x's default scrape_protocols (OpenMetrics first),
// and `scrape_protocols: [PrometheusText0.0.4]` (the text format only).
const (
	acceptPrometheus3 = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5," +
		"application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;" +
		"escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
	acceptText004 = "text/plain;version=0.0.4;q=0.2,*/*;q=0.1"
)

// The counters that have samples once a request went through the static cluster: each must
// be read as a COUNTER under this name.
var wantCounters = []string{
	"sluice_requests_total",
	"sluice_client_received_bytes_total",
	"sluice_client_sent_bytes_total",
	"sluice_upstream_connects_total",
}

// TestCountersAreTypedInBothFormats scrapes a real sluice's /metrics as Prometheus does, in the
// text format and in OpenMetrics, and reads each with Prometheus' own parsers (expfmt's, and
// the scrape loop's textparse): every counter family is a COUNTER whose samples carry its
// name, nothing is left UNTYPED.
func TestCountersAreTypedInBothFormats(t *testing.T) {
	admin := startSluice(t)

	// The text format, as `scrape_protocols: [PrometheusText0.0.4]` or curl gets it.
	for _, accept := range []string{"", acceptText004} {
		ct, body := scrape(t, admin, accept)
		if format := expfmt.ResponseFormat(http.Header{"Content-Type": {ct}}); format.FormatType() != expfmt.TypeTextPlain {
			t.Fatalf("Accept %q: Content-Type %q is not the text format", accept, ct)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation)
		families, err := parser.TextToMetricFamilies(strings.NewReader(body))
		if err != nil {
			t.Fatalf("expfmt: %v\n%s", err, body)
		}
		counters := 0
		for name, f := range families {
			switch f.GetType() {
			case dto.MetricType_UNTYPED:
				t.Errorf("expfmt reads %s as UNTYPED", name)
			case dto.MetricType_COUNTER:
				counters++
				if !strings.HasSuffix(name, "_total") {
					t.Errorf("counter %s is not named _total", name)
				}
			}
		}
		for _, name := range wantCounters {
			f := families[name]
			if f == nil || f.GetType() != dto.MetricType_COUNTER || len(f.GetMetric()) == 0 {
				t.Errorf("expfmt: %s is %v, want a COUNTER with samples", name, f.GetType())
			}
		}
		if declared := strings.Count(body, " counter\n"); counters != declared || counters == 0 {
			t.Errorf("expfmt read %d counter families of the %d declared", counters, declared)
		}
		checkScrape(t, ct, body)
	}

	// OpenMetrics, which Prometheus asks for first.
	ct, body := scrape(t, admin, acceptPrometheus3)
	if !strings.HasPrefix(ct, "application/openmetrics-text; version=1.0.0") {
		t.Fatalf("Prometheus' Accept got Content-Type %q", ct)
	}
	checkScrape(t, ct, body)
}

// checkScrape reads body as Prometheus' scrape loop does (textparse by Content-Type): every
// series has a typed family, and each counter in wantCounters is a counter.
func checkScrape(t *testing.T, contentType, body string) {
	t.Helper()
	p, err := textparse.New([]byte(body), contentType, nil, textparse.ParserOptions{})
	if err != nil {
		t.Fatalf("textparse.New(%q): %v", contentType, err)
	}
	types := map[string]model.MetricType{}
	seen := map[string]bool{}
	for {
		entry, err := p.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v\n%s", contentType, err, body)
		}
		switch entry {
		case textparse.EntryType:
			name, typ := p.Type()
			types[string(name)] = typ
		case textparse.EntrySeries:
			series, _, _ := p.Series()
			name := string(series)
			if i := strings.IndexByte(name, '{'); i >= 0 {
				name = name[:i]
			}
			seen[name] = true
			if family(types, name) == "" {
				t.Errorf("%s: series %s has no typed family", contentType, name)
			}
		}
	}
	for _, name := range wantCounters {
		if !seen[name] {
			t.Errorf("%s: no series %s", contentType, name)
		} else if typ := family(types, name); typ != model.MetricTypeCounter {
			t.Errorf("%s: %s is %q, want counter", contentType, name, typ)
		}
	}
}

// family is the type of the family a series belongs to: its own name's in the text format,
// the name without its suffix in OpenMetrics (and for histograms in both).
func family(types map[string]model.MetricType, series string) model.MetricType {
	if typ, ok := types[series]; ok {
		return typ
	}
	for _, suffix := range []string{"_total", "_created", "_bucket", "_sum", "_count", "_info"} {
		if typ, ok := types[strings.TrimSuffix(series, suffix)]; ok && strings.HasSuffix(series, suffix) {
			return typ
		}
	}
	return ""
}

func scrape(t *testing.T, admin, accept string) (contentType, body string) {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("GET /metrics: %d %v", res.StatusCode, err)
	}
	return res.Header.Get("Content-Type"), string(b)
}

// startSluice runs `sluice run` with one static cluster (a Go HTTP server), sends one request
// through it so that the counters have samples, and returns the admin API's address.
func startSluice(t *testing.T) string {
	t.Helper()
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	}))
	t.Cleanup(backend.Close)
	cfg := fmt.Sprintf(`
[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
cluster = "web"

[cluster.web]
kind = "static"
endpoints = [%q]
`, strings.TrimPrefix(backend.URL, "http://"))
	path := filepath.Join(t.TempDir(), "sluice.toml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(sluiceBinary(t), "run", "-c", path, "--log-format", "json")
	cmd.Env = append(os.Environ(), "RUST_LOG=info")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	fields := logFields(t, out, "listening", "admin API listening")
	listener, admin := fields["listening"]["addr"], fields["admin API listening"]["admin.addr"]
	res, err := http.Get("http://" + listener + "/")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("a request through sluice: %d", res.StatusCode)
	}
	// A request is counted when its answer has been written, which the client may see
	// first: wait (10 s at most) until it is, so that a loaded machine reads the same.
	for i := 0; i < 100; i++ {
		if _, body := scrape(t, admin, ""); strings.Contains(body, "sluice_requests_total{") {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return admin
}

// logFields waits (30 s at most) for a JSON log line with each message and returns its
// fields; the rest of the log is drained so that sluice never blocks on it.
func logFields(t *testing.T, out io.Reader, messages ...string) map[string]map[string]string {
	t.Helper()
	found := make(chan map[string]map[string]string, 1)
	go func() {
		got := map[string]map[string]string{}
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			var line struct {
				Fields map[string]any `json:"fields"`
			}
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			msg := fmt.Sprint(line.Fields["message"])
			for _, m := range messages {
				if msg == m && got[m] == nil {
					got[m] = map[string]string{}
					for k, v := range line.Fields {
						got[m][k] = fmt.Sprint(v)
					}
				}
			}
			if len(got) == len(messages) && found != nil {
				found <- got
				found = nil
			}
		}
		if found != nil {
			found <- map[string]map[string]string{"": {"log": strings.Join(lines, "\n")}}
		}
	}()
	select {
	case got := <-found:
		if log, ok := got[""]; ok {
			t.Fatalf("sluice exited:\n%s", log["log"])
		}
		return got
	case <-time.After(30 * time.Second):
		t.Fatal("sluice: no listening log lines in 30 s")
		return nil
	}
}

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
		const repoRoot = "../.."
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
