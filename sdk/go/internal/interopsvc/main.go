// Command interopsvc is the Go service of the cross-language interop tests and benchmarks.
//
//	interopsvc -acceptor HOST:PORT -service NAME -instance ID -capacity N [-delay-ms D] [-listen HOST:PORT]
//
// The token comes from $SLUICE_TOKEN. Without -listen it dials in through the SDK, prints
// "registered N" once N sessions are registered, and on SIGTERM drains, prints "drained" and
// exits 0; it exits 1 if the acceptor refuses it for good (400, 401, 404). With -listen it is a
// plain HTTP server on that address and prints "listening ADDR". Either way it answers every
// request with 200 and "<instance>\n" ("<instance> <r.RemoteAddr>\n" when it carries
// X-Echo-Client; "<instance> <local address>\n" when it carries X-Echo-Session, which names
// the session that served it: each session's local address is its own), after printing
// "start <id>" for a request that carries X-Request-Id and sleeping -delay-ms, with
// x-in-flight: the requests it was handling at that moment, this one included (so a test can
// see that it never had more than declared).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

func main() {
	acceptor := flag.String("acceptor", "", "the acceptor, HOST:PORT or unix:/path")
	service := flag.String("service", "", "the reverse cluster to join")
	instance := flag.String("instance", "", "the instance id, also the response body")
	capacity := flag.Int("capacity", 1, "sessions to keep registered")
	delayMs := flag.Int("delay-ms", 0, "milliseconds to wait before answering")
	listen := flag.String("listen", "", "serve as a plain HTTP server on this address instead")
	flag.Parse()

	h := handler(*instance, time.Duration(*delayMs)*time.Millisecond)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	if *listen != "" {
		os.Exit(listenMode(*listen, h, stop))
	}
	opts := sluice.Options{
		Acceptor: *acceptor,
		Service:  *service,
		Instance: *instance,
		Token:    os.Getenv("SLUICE_TOKEN"),
		Capacity: *capacity,
	}
	os.Exit(sessionMode(opts, h, stop))
}

var stdout sync.Mutex

// say prints one line with a single write, so that lines of concurrent requests never mix.
func say(format string, args ...any) {
	line := fmt.Sprintf(format+"\n", args...)
	stdout.Lock()
	defer stdout.Unlock()
	os.Stdout.WriteString(line)
}

func handler(instance string, delay time.Duration) http.Handler {
	var inFlight atomic.Int64
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		if id := r.Header.Get("X-Request-Id"); id != "" {
			say("start %s", id)
		}
		if delay > 0 {
			time.Sleep(delay)
		}
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-In-Flight", strconv.FormatInt(n, 10))
		if r.Header.Get("X-Echo-Client") != "" {
			io.WriteString(w, instance+" "+r.RemoteAddr+"\n")
			return
		}
		if r.Header.Get("X-Echo-Session") != "" {
			local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
			io.WriteString(w, fmt.Sprintf("%s %v\n", instance, local))
			return
		}
		io.WriteString(w, instance+"\n")
	})
}

func sessionMode(opts sluice.Options, h http.Handler, stop <-chan os.Signal) int {
	ln, err := sluice.Listen(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interopsvc:", err)
		return 2
	}
	srv := &http.Server{Handler: ln.Handler(h)}
	go srv.Serve(ln)
	refused := make(chan error, 1)
	go watch(ln, opts.Capacity, refused)
	select {
	case err := <-refused:
		fmt.Fprintln(os.Stderr, "interopsvc: refused for good:", err)
		ln.Close()
		return 1
	case <-stop:
	}
	// Drain first: the proxy finishes busy sessions and closes them all; then stop serving.
	if err := ln.Shutdown(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "interopsvc: drain:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	say("drained")
	return 0
}

// watch prints "registered N" once N sessions are registered, and reports a permanent
// refusal.
func watch(ln *sluice.Listener, n int, refused chan<- error) {
	printed := false
	for {
		st, changed := ln.Watch()
		if st.Registered >= n && !printed {
			say("registered %d", n)
			printed = true
		}
		var e *sluice.Error
		if errors.As(st.LastError, &e) && !e.Retryable() {
			refused <- e
			return
		}
		<-changed
	}
}

func listenMode(addr string, h http.Handler, stop <-chan os.Signal) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interopsvc:", err)
		return 2
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	say("listening %s", ln.Addr())
	<-stop
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	return 0
}
