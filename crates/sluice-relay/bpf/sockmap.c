// SPDX-License-Identifier: MIT OR GPL-2.0
//
// Sluice's kernel splicing for relayed connections (crates/sluice-relay/src/sockmap.rs).
//
// Both sockets of a relayed connection sit in `socks`, at two slots. `ends`, keyed by each
// socket's cookie, names the peer's slot; the verdict program sends every segment a socket
// receives out of its peer (an egress redirect), so the bytes never reach user space. Bytes
// redirected are counted per socket (the relay's byte counters, its idle timeout and its
// half-close read them). A socket whose peer is not in `socks` yet (the moment between the
// two insertions) has its bytes delivered to user space instead, and from then on always:
// `passed` tells user space to forward that direction itself, so the order of bytes holds.
//
// Built by scripts/bpf (clang -target bpf); the object is committed beside this file and the
// test command checks that it matches a fresh build.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

// Kept in step with `End` in sockmap.rs.
struct end {
	__u32 peer;   // the peer socket's slot in `socks`
	__u32 passed; // non-zero: this socket's bytes go to user space
	__u64 bytes;  // bytes redirected to the peer
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKMAP);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct end);
} ends SEC(".maps");

SEC("sk_skb/stream_verdict")
int sluice_redirect(struct __sk_buff *skb)
{
	__u64 cookie = bpf_get_socket_cookie(skb);
	struct end *end = bpf_map_lookup_elem(&ends, &cookie);
	if (!end)
		return SK_PASS;
	// A segment with no data (the FIN; TCP has already taken note of it): nothing to send.
	// Redirected, the peer's sender would fail on it and mark the peer's socket broken.
	if (!skb->len)
		return SK_DROP;
	if (!end->passed) {
		__u32 peer = end->peer;
		struct bpf_sock *sk = bpf_map_lookup_elem(&socks, &peer);
		if (sk) {
			bpf_sk_release(sk);
			__sync_fetch_and_add(&end->bytes, skb->len);
			return bpf_sk_redirect_map(skb, &socks, peer, 0);
		}
		end->passed = 1;
	}
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
