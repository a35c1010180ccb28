// Command hello serves "hello\n" through Sluice: it dials in to the acceptor and keeps
// -capacity sessions registered. SIGTERM or SIGINT drains (the proxy finishes busy sessions
// and closes them all) and then stops the server, so no request is lost.
//
//	SLUICE_TOKEN=s3cret go run ./examples/hello -acceptor 127.0.0.1:7070 -service hello -capacity 4
package main

import (
	"context"
	"flag"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

func main() {
	acceptor := flag.String("acceptor", "127.0.0.1:7070", "the acceptor, HOST:PORT or unix:/path")
	service := flag.String("service", "hello", "the reverse cluster to join")
	capacity := flag.Int("capacity", 4, "sessions to keep registered")
	flag.Parse()

	ln, err := sluice.Listen(context.Background(), sluice.Options{
		Acceptor: *acceptor,
		Service:  *service,
		Token:    os.Getenv("SLUICE_TOKEN"),
		Capacity: *capacity,
	})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello\n")
	})
	srv := &http.Server{Handler: ln.Handler(hello)}
	go srv.Serve(ln)

	stop, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	<-stop.Done()
	ctx, cancelGrace := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancelGrace()
	if err := ln.Shutdown(ctx); err != nil { // first: drain the sessions
		log.Printf("drain: %v", err)
	}
	srv.Shutdown(ctx) // then: stop the server
}
