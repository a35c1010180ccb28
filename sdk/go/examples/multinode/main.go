// Command multinode serves through many Sluice nodes at once: it dials every node the acceptor
// address names, splits -capacity sessions among them by demand, and never holds more in all.
// Its handler counts its own concurrency: GET /max (through Sluice, or on -stats) answers the
// most requests it ever had at once, which must not exceed the capacity; on -stats only,
// POST /capacity?n=K sets the capacity at runtime; every other path answers "hello" after
// -delay. Flags default to the environment (SLUICE_ACCEPTOR,
// SLUICE_SERVICE, SLUICE_CAPACITY, SLUICE_INSTANCE, SLUICE_TOKEN). SIGTERM drains and prints
// "max_in_flight N".
//
//	go run ./examples/multinode -acceptor dns:sluice-acceptor.default.svc.cluster.local:7070 \
//	    -service api -capacity 16 -delay 20ms -stats 127.0.0.1:9000
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

func main() {
	capacity, _ := strconv.Atoi(env("SLUICE_CAPACITY", "16"))
	acceptor := flag.String("acceptor", env("SLUICE_ACCEPTOR", "127.0.0.1:7070"), "host:port, dns:NAME:PORT or a:7070,b:7070")
	service := flag.String("service", env("SLUICE_SERVICE", "api"), "the reverse cluster to join")
	instance := flag.String("instance", env("SLUICE_INSTANCE", ""), "the instance id (default: the proxy uses the peer's IP)")
	flag.IntVar(&capacity, "capacity", capacity, "sessions in all, across the nodes")
	delay := flag.Duration("delay", 0, "how long each request takes")
	stats := flag.String("stats", env("SLUICE_STATS", ""), "where to serve /max and /status locally (none if empty)")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ln, err := sluice.Listen(context.Background(), sluice.Options{
		Acceptor: *acceptor, Service: *service, Instance: *instance, Token: os.Getenv("SLUICE_TOKEN"),
		Capacity: capacity, Logger: logger,
	})
	if err != nil {
		log.Fatal(err)
	}
	var c counter
	mux := http.NewServeMux()
	mux.HandleFunc("/max", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, c.most.Load()) })
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) { json.NewEncoder(w).Encode(ln.Status()) })
	mux.Handle("/", c.count(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(*delay)
		fmt.Fprintln(w, "hello")
	}))
	srv := &http.Server{Handler: ln.Handler(mux)}
	go srv.Serve(ln)
	if *stats != "" {
		local := http.NewServeMux()
		local.Handle("/", mux)
		local.HandleFunc("/capacity", func(w http.ResponseWriter, r *http.Request) {
			n, err := strconv.Atoi(r.URL.Query().Get("n"))
			if err != nil || n < 0 || r.Method != http.MethodPost {
				http.Error(w, "POST /capacity?n=K with K >= 0", http.StatusBadRequest)
				return
			}
			ln.SetCapacity(n)
			fmt.Fprintln(w, n)
		})
		go func() { log.Fatal(http.ListenAndServe(*stats, local)) }()
	}

	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	<-stop.Done()
	ctx, cancelGrace := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelGrace()
	ln.Shutdown(ctx) // drains at every node
	srv.Shutdown(ctx)
	fmt.Printf("max_in_flight %d\n", c.most.Load())
}

// counter tracks the requests in the handler now and the most ever at once.
type counter struct{ now, most atomic.Int64 }

func (c *counter) count(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := c.now.Add(1)
		defer c.now.Add(-1)
		for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
		}
		h(w, r)
	}
}

func env(key, fallback string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return fallback
}
