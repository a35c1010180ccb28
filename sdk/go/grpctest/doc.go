// Package grpctest tests HTTP/2 dial-in sessions of the Go SDK end to end: grpc-go's own
// interop test service and its health service, and a net/http server speaking h2c, each
// registered with a real `sluice run` through sluice.Options.Streams and called through
// Sluice's listener; and the same calls through a static h2c cluster (Sluice connecting to
// the server, as NGINX's grpc_pass does). It is a module of its own so that the SDK itself
// depends on nothing.
//
// The sluice binary is $SLUICE_BIN, or the debug build cargo makes on first use
// (`cargo build -p sluice-cli --bin sluice` into $CARGO_TARGET_DIR or the repository's
// target/). The tests never skip: without a binary they fail.
package grpctest
