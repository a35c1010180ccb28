package grpctest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sluice "github.com/sluice-proxy/sluice/sdk/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/interop"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// gRPC through Sluice to a grpc-go server on HTTP/2 dial-in sessions: the server is grpc-go's
// interop test service (unary, server-, client- and bidirectional streaming) and its health
// service, served by grpc.NewServer().Serve(ln) on the SDK's Listener, unchanged; the client
// is grpc-go speaking h2c with prior knowledge to Sluice's listener.

// Metadata a test call may carry to make the service behave for it.
const (
	// sleepKey: UnaryCall waits this long (a Go duration) or until its context ends.
	sleepKey = "test-sleep"
	// holdKey: UnaryCall waits until its context ends and reports why on service.ended.
	holdKey = "test-hold"
	// echoKey: UnaryCall answers with the request's own payload.
	echoKey = "test-echo"
	// greetKey: FullDuplexCall sends one message of this many bytes before reading any.
	greetKey = "test-greet"
	// clientAddrKey is the field Sluice sets on every request: gRPC metadata, lower case.
	clientAddrKey = "sluice-client-addr"
)

// maxMessage lets the 4 MiB messages (and their few bytes of framing) through both ways.
const maxMessage = 8 << 20

// service is the interop test service with a UnaryCall that counts its calls in flight,
// records the client address Sluice passed, and sleeps, holds or echoes when asked.
type service struct {
	testgrpc.TestServiceServer
	inFlight, most atomic.Int32
	started        chan struct{} // a held call is in the handler
	ended          chan error    // a held call's context ended, with this error

	mu          sync.Mutex
	clientAddrs [][]string // sluice-client-addr of every UnaryCall, in order
}

func newService() *service {
	return &service{
		TestServiceServer: interop.NewTestServer(),
		started:           make(chan struct{}, 16),
		ended:             make(chan error, 16),
	}
}

func (s *service) UnaryCall(ctx context.Context, in *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	now := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for m := s.most.Load(); now > m && !s.most.CompareAndSwap(m, now); m = s.most.Load() {
	}
	md, _ := metadata.FromIncomingContext(ctx)
	s.mu.Lock()
	s.clientAddrs = append(s.clientAddrs, md.Get(clientAddrKey))
	s.mu.Unlock()
	if v := md.Get(sleepKey); len(v) == 1 {
		d, err := time.ParseDuration(v[0])
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if len(md.Get(holdKey)) > 0 {
		s.started <- struct{}{}
		<-ctx.Done()
		s.ended <- ctx.Err()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if len(md.Get(echoKey)) > 0 {
		return &testpb.SimpleResponse{Payload: in.GetPayload()}, nil
	}
	return s.TestServiceServer.UnaryCall(ctx, in)
}

// FullDuplexCall speaks first when asked (as a subscription does: the client sends nothing
// until the server's first message), then is the interop service's.
func (s *service) FullDuplexCall(stream testgrpc.TestService_FullDuplexCallServer) error {
	md, _ := metadata.FromIncomingContext(stream.Context())
	if v := md.Get(greetKey); len(v) == 1 {
		size, err := strconv.Atoi(v[0])
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: payload(size)}); err != nil {
			return err
		}
	}
	return s.TestServiceServer.FullDuplexCall(stream)
}

// setup is a Sluice, a gRPC server on capacity sessions of streams streams, and a client.
type setup struct {
	ln     *sluice.Listener
	svc    *service
	client testgrpc.TestServiceClient
	health healthpb.HealthClient
	// local is the client's address for each connection it made to Sluice.
	mu    sync.Mutex
	local []string
}

func newSetup(t *testing.T, capacity, streams int) *setup {
	t.Helper()
	n := startSluice(t)
	st := &setup{svc: newService()}
	srv := st.server()
	served := make(chan error, 1)
	st.ln = listen(t, n, capacity, streams, func(ln *sluice.Listener) {
		go func() { served <- srv.Serve(ln) }()
	})
	st.stopAtCleanup(t, srv, served)
	st.dial(t, n.HTTP)
	return st
}

// staticConfig is one node whose route goes to a static h2c cluster at one endpoint.
const staticConfig = `
[[listener]]
name = "public"
listen = "127.0.0.1:0"

[[route]]
cluster = "grpc"

[cluster.grpc]
kind = "static"
endpoints = ["%s"]
protocol = "h2c"
`

// newStaticSetup is the same service listening on 127.0.0.1:0 behind a static h2c cluster:
// Sluice connects to it, as NGINX's grpc_pass and HAProxy's proto h2 do.
func newStaticSetup(t *testing.T) *setup {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	st := &setup{svc: newService()}
	srv := st.server()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	st.stopAtCleanup(t, srv, served)
	n := startSluiceWith(t, fmt.Sprintf(staticConfig, lis.Addr()))
	st.dial(t, n.HTTP)
	return st
}

// server is a grpc-go server of the test service and the health service.
func (st *setup) server() *grpc.Server {
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	testgrpc.RegisterTestServiceServer(srv, st.svc)
	hs := health.NewServer()
	hs.SetServingStatus("grpc.testing.TestService", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return srv
}

func (st *setup) stopAtCleanup(t *testing.T, srv *grpc.Server, served chan error) {
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
}

// dial makes the client: grpc-go speaking h2c to Sluice's listener at addr.
func (st *setup) dial(t *testing.T, addr string) {
	t.Helper()
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				st.mu.Lock()
				st.local = append(st.local, conn.LocalAddr().String())
				st.mu.Unlock()
			}
			return conn, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	st.client = testgrpc.NewTestServiceClient(cc)
	st.health = healthpb.NewHealthClient(cc)
}

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), testDeadline)
	t.Cleanup(cancel)
	return ctx
}

func payload(size int) *testpb.Payload {
	return &testpb.Payload{Type: testpb.PayloadType_COMPRESSABLE, Body: make([]byte, size)}
}

// TestGRPC runs the kinds of call on one Sluice and one server of 2 sessions × 8 streams.
func TestGRPC(t *testing.T) {
	calls(t, newSetup(t, 2, 8), true)
}

// TestGRPCStatic runs them through a static h2c cluster (issue 31, item 4).
func TestGRPCStatic(t *testing.T) {
	calls(t, newStaticSetup(t), false)
}

// calls runs every kind of call through st; dialIn: the server is on dial-in sessions, so
// Sluice-Client-Addr reaches it.
func calls(t *testing.T, st *setup, dialIn bool) {

	t.Run("unary", func(t *testing.T) {
		resp, err := st.client.UnaryCall(callCtx(t), &testpb.SimpleRequest{
			ResponseType: testpb.PayloadType_COMPRESSABLE, ResponseSize: 314159, Payload: payload(271828),
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := len(resp.GetPayload().GetBody()); n != 314159 {
			t.Errorf("response payload %d bytes, want 314159", n)
		}
	})

	t.Run("empty", func(t *testing.T) {
		if _, err := st.client.EmptyCall(callCtx(t), &testpb.Empty{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("health", func(t *testing.T) {
		resp, err := st.health.Check(callCtx(t), &healthpb.HealthCheckRequest{Service: "grpc.testing.TestService"})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("Check: %v, %v", resp, err)
		}
		_, err = st.health.Check(callCtx(t), &healthpb.HealthCheckRequest{Service: "no.such.Service"})
		if status.Code(err) != codes.NotFound {
			t.Fatalf("Check of an unknown service: %v, want NOT_FOUND", err)
		}
	})

	t.Run("metadata both ways", func(t *testing.T) {
		ctx := metadata.AppendToOutgoingContext(callCtx(t),
			"x-grpc-test-echo-initial", "initial-value", "x-grpc-test-echo-trailing-bin", "\x0a\x0b\x0a\x0b")
		var header, trailer metadata.MD
		if _, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{ResponseSize: 1}, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			t.Fatal(err)
		}
		if v := header.Get("x-grpc-test-echo-initial"); len(v) != 1 || v[0] != "initial-value" {
			t.Errorf("header %v", header)
		}
		if v := trailer.Get("x-grpc-test-echo-trailing-bin"); len(v) != 1 || v[0] != "\x0a\x0b\x0a\x0b" {
			t.Errorf("trailer %v", trailer)
		}
	})

	// Sluice-Client-Addr goes over sessions only.
	clientAddr := func(t *testing.T) {
		st.svc.mu.Lock()
		st.svc.clientAddrs = nil
		st.svc.mu.Unlock()
		if _, err := st.client.UnaryCall(callCtx(t), &testpb.SimpleRequest{}); err != nil {
			t.Fatal(err)
		}
		st.mu.Lock()
		local := append([]string(nil), st.local...)
		st.mu.Unlock()
		st.svc.mu.Lock()
		defer st.svc.mu.Unlock()
		if len(st.svc.clientAddrs) != 1 || len(st.svc.clientAddrs[0]) != 1 {
			t.Fatalf("%s metadata %q, want one value per call", clientAddrKey, st.svc.clientAddrs)
		}
		if len(local) != 1 || st.svc.clientAddrs[0][0] != local[0] {
			t.Errorf("%s %q, want the client's address (its connections: %q)", clientAddrKey, st.svc.clientAddrs[0][0], local)
		}
	}
	if dialIn {
		t.Run("client address", clientAddr)
	}

	t.Run("server streaming", func(t *testing.T) {
		sizes := []int32{31415, 9, 2653, 58979}
		req := &testpb.StreamingOutputCallRequest{ResponseType: testpb.PayloadType_COMPRESSABLE}
		for _, s := range sizes {
			req.ResponseParameters = append(req.ResponseParameters, &testpb.ResponseParameters{Size: s, IntervalUs: 20_000})
		}
		stream, err := st.client.StreamingOutputCall(callCtx(t), req)
		if err != nil {
			t.Fatal(err)
		}
		var got []int32
		for {
			resp, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, int32(len(resp.GetPayload().GetBody())))
		}
		if !equal(got, sizes) {
			t.Errorf("response sizes %v, want %v", got, sizes)
		}
	})

	t.Run("client streaming", func(t *testing.T) {
		stream, err := st.client.StreamingInputCall(callCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []int{27182, 8, 1828, 45904} {
			if err := stream.Send(&testpb.StreamingInputCallRequest{Payload: payload(s)}); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := stream.CloseAndRecv()
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetAggregatedPayloadSize(); got != 74922 {
			t.Errorf("aggregated size %d, want 74922", got)
		}
	})

	t.Run("bidirectional", func(t *testing.T) {
		stream, err := st.client.FullDuplexCall(callCtx(t))
		if err != nil {
			t.Fatal(err)
		}
		// Ping-pong: each response arrives before the next request is sent, so both
		// directions are open at once.
		for i, s := range []int32{31415, 9, 2653, 58979} {
			err := stream.Send(&testpb.StreamingOutputCallRequest{
				ResponseType:       testpb.PayloadType_COMPRESSABLE,
				ResponseParameters: []*testpb.ResponseParameters{{Size: s}},
				Payload:            payload(int(s) / 2),
			})
			if err != nil {
				t.Fatal(err)
			}
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("response %d: %v", i, err)
			}
			if n := int32(len(resp.GetPayload().GetBody())); n != s {
				t.Errorf("response %d: %d bytes, want %d", i, n, s)
			}
		}
		if err := stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("after CloseSend: %v, want EOF", err)
		}
	})

	t.Run("bidirectional, the server first", func(t *testing.T) {
		stream, err := st.client.FullDuplexCall(metadata.AppendToOutgoingContext(callCtx(t), greetKey, "1234"))
		if err != nil {
			t.Fatal(err)
		}
		// Nothing is sent until the server's first message has come.
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("the server's first message: %v", err)
		}
		if n := len(resp.GetPayload().GetBody()); n != 1234 {
			t.Errorf("the server's first message: %d bytes, want 1234", n)
		}
		err = stream.Send(&testpb.StreamingOutputCallRequest{
			ResponseType:       testpb.PayloadType_COMPRESSABLE,
			ResponseParameters: []*testpb.ResponseParameters{{Size: 77}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := stream.Recv(); err != nil || len(resp.GetPayload().GetBody()) != 77 {
			t.Fatalf("the answer: %v, %v", resp, err)
		}
		stream.CloseSend()
		if _, err := stream.Recv(); err != io.EOF {
			t.Errorf("after CloseSend: %v, want EOF", err)
		}
	})

	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), sleepKey, "10s"), 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("%v, want DEADLINE_EXCEEDED", err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Errorf("the deadline took %v", waited)
		}
	})

	t.Run("cancellation reaches the server", func(t *testing.T) {
		ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(t.Context(), holdKey, "1"))
		defer cancel()
		errc := make(chan error, 1)
		go func() {
			_, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{})
			errc <- err
		}()
		select {
		case <-st.svc.started:
		case <-time.After(testDeadline):
			t.Fatal("the held call did not reach the server")
		}
		cancel()
		if err := <-errc; status.Code(err) != codes.Canceled {
			t.Errorf("client: %v, want CANCELED", err)
		}
		select {
		case err := <-st.svc.ended:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("the server's context ended with %v, want context.Canceled", err)
			}
		case <-time.After(testDeadline):
			t.Fatal("the server's context was not cancelled")
		}
	})

	t.Run("large messages", func(t *testing.T) {
		body := make([]byte, 4<<20)
		rand.Read(body)
		ctx := metadata.AppendToOutgoingContext(callCtx(t), echoKey, "1")
		resp, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{
			Payload: &testpb.Payload{Type: testpb.PayloadType_COMPRESSABLE, Body: body},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetPayload().GetBody(); !bytes.Equal(got, body) {
			t.Errorf("the 4 MiB echo came back as %d bytes, not the same", len(got))
		}
	})

	t.Run("trailers-only error status", func(t *testing.T) {
		const message = "test status message: ünïcode \t and %"
		var header, trailer metadata.MD
		ctx := metadata.AppendToOutgoingContext(callCtx(t), "x-grpc-test-echo-trailing-bin", "\x01\x02")
		_, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{
			ResponseStatus: &testpb.EchoStatus{Code: int32(codes.FailedPrecondition), Message: message},
		}, grpc.Header(&header), grpc.Trailer(&trailer))
		s, _ := status.FromError(err)
		if s.Code() != codes.FailedPrecondition || s.Message() != message {
			t.Errorf("status %v, want FAILED_PRECONDITION %q", err, message)
		}
		if v := trailer.Get("x-grpc-test-echo-trailing-bin"); len(v) != 1 || v[0] != "\x01\x02" {
			t.Errorf("trailer %v", trailer)
		}
		if v := trailer.Get("grpc-status"); len(v) != 0 {
			t.Errorf("grpc-status left in the trailer metadata: %v", v)
		}
		_, err = st.client.UnimplementedCall(callCtx(t), &testpb.Empty{})
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("UnimplementedCall: %v, want UNIMPLEMENTED", err)
		}
	})
}

// TestGRPCStreamsBoundConcurrency: one session of 3 streams takes 3 calls at once; of 10 slow
// calls launched together the server never sees more than 3, and all 10 complete (the rest
// wait in Sluice's queue).
func TestGRPCStreamsBoundConcurrency(t *testing.T) {
	st := newSetup(t, 1, 3)
	const calls = 10
	ctx := metadata.AppendToOutgoingContext(callCtx(t), sleepKey, "300ms")
	errc := make(chan error, calls)
	for range calls {
		go func() {
			_, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{})
			errc <- err
		}()
	}
	for range calls {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if most := st.svc.most.Load(); most != 3 {
		t.Errorf("the server had at most %d calls at once, want 3 (the session's streams)", most)
	}
	st.svc.mu.Lock()
	defer st.svc.mu.Unlock()
	if len(st.svc.clientAddrs) != calls {
		t.Errorf("the server saw %d calls, want %d", len(st.svc.clientAddrs), calls)
	}
}

// TestGRPCShutdownFinishesCallsInFlight: ln.Shutdown drains HTTP/2 sessions as HTTP/1.1
// ones: calls in flight finish, then Sluice closes every session and Shutdown returns.
func TestGRPCShutdownFinishesCallsInFlight(t *testing.T) {
	st := newSetup(t, 2, 4)
	const calls = 6
	ctx := metadata.AppendToOutgoingContext(callCtx(t), sleepKey, "700ms")
	errc := make(chan error, calls)
	for range calls {
		go func() {
			_, err := st.client.UnaryCall(ctx, &testpb.SimpleRequest{})
			errc <- err
		}()
	}
	deadline := time.After(testDeadline)
	for st.svc.inFlight.Load() < calls {
		select {
		case <-deadline:
			t.Fatalf("%d of %d calls reached the server", st.svc.inFlight.Load(), calls)
		case <-time.After(10 * time.Millisecond):
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	if err := st.ln.Shutdown(shutdown); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	for range calls {
		if err := <-errc; err != nil {
			t.Errorf("a call in flight at the drain: %v", err)
		}
	}
	if got := st.ln.Status().Registered; got != 0 {
		t.Errorf("%d sessions registered after Shutdown", got)
	}
}

func equal(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
