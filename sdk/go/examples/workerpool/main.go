// Command workerpool declares exactly the concurrency it has: W worker goroutines do the work
// and the instance keeps W sessions registered, so the proxy never sends more requests at once
// than there are workers. SIGUSR1 adds a worker, SIGUSR2 removes one; the session count
// follows. SIGTERM drains and exits.
//
//	go run ./examples/workerpool -acceptor 127.0.0.1:7070 -service work -workers 4
//	kill -USR1 <pid>   # 5 workers, 5 sessions
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
)

// pool runs jobs on a resizable set of worker goroutines.
type pool struct {
	jobs chan func()
	quit chan struct{}
	size int
}

func (p *pool) resize(n int) {
	for ; p.size < n; p.size++ {
		go p.work()
	}
	for ; p.size > n; p.size-- {
		p.quit <- struct{}{} // taken by the next idle worker
	}
}

func (p *pool) work() {
	for {
		select {
		case job := <-p.jobs:
			job()
		case <-p.quit:
			return
		}
	}
}

// do runs job on a worker and waits for it.
func (p *pool) do(job func()) {
	done := make(chan struct{})
	p.jobs <- func() { job(); close(done) }
	<-done
}

func main() {
	acceptor := flag.String("acceptor", "127.0.0.1:7070", "the acceptor, HOST:PORT or unix:/path")
	service := flag.String("service", "work", "the reverse cluster to join")
	workers := flag.Int("workers", 4, "initial number of workers, and of sessions")
	flag.Parse()

	p := &pool{jobs: make(chan func()), quit: make(chan struct{})}
	p.resize(*workers)
	ln, err := sluice.Listen(context.Background(), sluice.Options{
		Acceptor: *acceptor, Service: *service, Token: os.Getenv("SLUICE_TOKEN"), Capacity: *workers,
	})
	if err != nil {
		log.Fatal(err)
	}
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.do(func() {
			time.Sleep(50 * time.Millisecond) // stands in for CPU work or a bounded resource
			fmt.Fprintf(w, "done by one of %d workers\n", ln.Status().Capacity)
		})
	})
	srv := &http.Server{Handler: ln.Handler(work)}
	go srv.Serve(ln)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	for sig := range signals {
		switch sig {
		case syscall.SIGUSR1: // grow the pool first, then invite the extra request
			p.resize(p.size + 1)
			ln.SetCapacity(p.size)
		case syscall.SIGUSR2: // ask for one session fewer first, then let a worker go
			if p.size > 1 {
				ln.SetCapacity(p.size - 1)
				p.resize(p.size - 1)
			}
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if err := ln.Shutdown(ctx); err != nil {
				log.Printf("drain: %v", err)
			}
			srv.Shutdown(ctx)
			cancel()
			return
		}
		log.Printf("workers and sessions: %d", p.size)
	}
}
