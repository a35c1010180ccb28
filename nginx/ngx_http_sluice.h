/*
 * ngx_http_sluice_module: each NGINX worker is a consumer of a Sluice acceptor's handoff
 * socket (docs/handoff.md in the Sluice repository). Services dial in to the acceptor and
 * register sessions (connected sockets); the acceptor lends them to this worker as file
 * descriptors, and the worker proxies requests over them without ever calling connect().
 *
 * Layout, each file using only those below it:
 *   ngx_http_sluice_module.c   the module: directives, the worker's life cycle
 *   ngx_http_sluice_status.c   the sluice_status handler
 *   ngx_http_sluice_balancer.c the precontent phase that reads the body, then reserves a
 *                              session or parks the request in the FIFO queue; the
 *                              peer.get/peer.free balancer
 *   ngx_http_sluice_client.c   Sluice-Client-Addr on every request sent over a session
 *   ngx_http_sluice_pool.c     the worker's sessions: idle pool, leases, waiters, credit
 *   ngx_http_sluice_handoff.c  the non-blocking SOCK_SEQPACKET connection to the acceptor:
 *                              framing, fd passing, message parsing, reconnect with backoff;
 *                              what arrives goes up through ngx_http_sluice_events_t
 *
 * Everything here runs in one worker's event loop; nothing is shared between workers.
 */

#ifndef _NGX_HTTP_SLUICE_H_INCLUDED_
#define _NGX_HTTP_SLUICE_H_INCLUDED_


#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>
#include <ngx_http.h>
#include <sys/un.h>


/* docs/handoff.md: one message is at most 512 bytes; names are 1-128 bytes. */
#define NGX_HTTP_SLUICE_MAX_LINE     512
#define NGX_HTTP_SLUICE_MAX_NAME     128
/* Messages waiting for the socket to become writable; beyond this the peer is stuck. */
#define NGX_HTTP_SLUICE_OUT_MAX      1024
/* Reconnect backoff: 100 ms doubling to 5 s, as docs/handoff.md describes. */
#define NGX_HTTP_SLUICE_BACKOFF_MIN  100
#define NGX_HTTP_SLUICE_BACKOFF_MAX  5000
/* How long an exiting worker waits for the sessions its open credit may still bring. */
#define NGX_HTTP_SLUICE_LINGER       2000


typedef struct ngx_http_sluice_upstream_s  ngx_http_sluice_upstream_t;


/* The worker stops taking requests (reload, quit) or stops outright. */
#define ngx_http_sluice_exiting()  (ngx_exiting || ngx_terminate || ngx_quit)


/*
 * What the handoff connection reports to the sessions it serves: the connection knows
 * nothing of how they are kept, so the dependency runs one way (pool -> handoff). The pool's
 * table is ngx_http_sluice_pool_events.
 */
typedef struct {
    /* HELLO arrived: the connection is ready for CREDIT. */
    void        (*connected)(ngx_http_sluice_upstream_t *up);
    /* SESSION with its fd, within our credit: the fd is the callee's from now on. */
    void        (*session)(ngx_http_sluice_upstream_t *up, uint64_t id,
                    u_char *instance, size_t len, ngx_socket_t fd);
    /* RECALL for our cluster and slice. */
    void        (*recall)(ngx_http_sluice_upstream_t *up, ngx_uint_t n);
    /* DRAIN of an instance. */
    void        (*drain)(ngx_http_sluice_upstream_t *up, u_char *instance,
                    size_t len);
    /* SLICE for our cluster and slice: it has no session registered (empty) or has some. */
    void        (*slice)(ngx_http_sluice_upstream_t *up, ngx_uint_t empty);
    /* Whether a request still holds or waits for a session (an exiting worker stays). */
    ngx_uint_t  (*busy)(ngx_http_sluice_upstream_t *up);
} ngx_http_sluice_events_t;


/* Where a session is: exactly one of these at any time. */
typedef enum {
    NGX_HTTP_SLUICE_IDLE = 0,     /* in its instance's idle stack, watched for EOF */
    NGX_HTTP_SLUICE_RESERVED,     /* promised to a request that has not reached peer.get */
    NGX_HTTP_SLUICE_LEASED        /* the upstream module owns the connection */
} ngx_http_sluice_state_e;


/* The sessions a worker holds of one instance of the service, while it holds any. */
typedef struct {
    ngx_queue_t                    queue;      /* up->instances */
    ngx_queue_t                    idle;       /* its idle sessions, the one pooled last first */
    ngx_uint_t                     held;       /* its sessions here, idle or busy */
    size_t                         len;
    u_char                         name[NGX_HTTP_SLUICE_MAX_NAME];
} ngx_http_sluice_instance_t;


typedef struct {
    ngx_queue_t                    queue;      /* instance->idle, or up->busy */
    ngx_queue_t                    turn;       /* up->turns while idle */
    ngx_connection_t              *connection;
    ngx_http_sluice_upstream_t    *up;
    ngx_http_sluice_instance_t    *instance;
    uint64_t                       id;         /* the acceptor's id, for RETURN/GONE */
    ngx_uint_t                     epoch;      /* the handoff connection that lent it */
    ngx_http_sluice_state_e        state;
    unsigned                       draining:1;
} ngx_http_sluice_session_t;


/* A request parked in the admission queue, or holding a reserved session. */
typedef struct {
    ngx_http_sluice_upstream_t    *up;
    ngx_http_request_t            *request;
    ngx_http_sluice_session_t     *session;    /* reserved for this request */
    ngx_queue_t                    queue;      /* up->waiters while waiting */
    ngx_event_t                    wake;       /* queue_timeout, or posted on a grant */
    unsigned                       reading_body:1;
    unsigned                       admitted:1;  /* took a session or joined the queue */
    unsigned                       waiting:1;
    unsigned                       timed_out:1;
    unsigned                       no_sessions:1;  /* refused: the slice has none */
} ngx_http_sluice_ctx_t;


/* One outgoing message that could not be sent yet (the socket was full). */
typedef struct {
    size_t                         len;
    ngx_socket_t                   fd;         /* a session's fd (RETURN) or -1 */
    u_char                         line[NGX_HTTP_SLUICE_MAX_LINE];
} ngx_http_sluice_msg_t;


/* The counts sluice_status reports: this worker's, since it started. */
typedef struct {
    ngx_uint_t                     received;   /* SESSION messages */
    ngx_uint_t                     returned;   /* RETURN sent */
    ngx_uint_t                     gone;       /* GONE sent */
    ngx_uint_t                     served;     /* leases handed to peer.get */
    ngx_uint_t                     queued;     /* requests that had to wait */
    ngx_uint_t                     rejected;   /* 503: queue full, queue_timeout, or no
                                                  session registered */
    ngx_uint_t                     connects;   /* HELLO exchanges completed */
    ngx_uint_t                     protocol_errors;
    ngx_uint_t                     recalls;    /* sessions asked back by RECALL */
    ngx_uint_t                     drains;     /* DRAIN messages */
} ngx_http_sluice_stats_t;


/* One `upstream {}` block with `sluice_sessions`: its configuration and, in a worker, its
 * runtime state. */
struct ngx_http_sluice_upstream_s {
    /* configuration */
    ngx_str_t                      name;       /* the upstream block's name */
    ngx_str_t                      path;       /* the handoff socket, without "unix:" */
    ngx_str_t                      cluster;
    ngx_str_t                      slice;
    ngx_uint_t                     idle_target;
    ngx_uint_t                     queue_max;
    ngx_msec_t                     queue_timeout;
    ngx_msec_t                     no_sessions_wait;  /* 0: 503 at once */
    struct sockaddr_un             sockaddr;   /* also pc->sockaddr for logging */
    ngx_str_t                      peer_name;  /* "sluice:<cluster>/<slice>" */

    /* the handoff connection */
    const ngx_http_sluice_events_t *events;    /* what it reports to */
    ngx_connection_t              *handoff;    /* NULL while disconnected */
    ngx_uint_t                     epoch;      /* bumped on every disconnect */
    unsigned                       hello:1;    /* the acceptor's HELLO arrived */
    unsigned                       empty:1;    /* the acceptor said SLICE ... empty */
    ngx_event_t                    reconnect;
    ngx_msec_t                     backoff;
    ngx_http_sluice_msg_t         *out;        /* ring of NGX_HTTP_SLUICE_OUT_MAX */
    ngx_uint_t                     out_head;
    ngx_uint_t                     out_count;
    ngx_event_t                    flush;      /* retries sending what waits */
    ngx_event_t                    linger;     /* an exiting worker's last duties */
    ngx_msec_t                     linger_until;

    /* sessions and requests: the idle ones are in their instance's stack, and each has a
     * turn here, in the order they were pooled (ngx_http_sluice_pool.c) */
    ngx_queue_t                    turns;
    ngx_queue_t                    instances;  /* ngx_http_sluice_instance_t */
    ngx_queue_t                    busy;       /* reserved and leased */
    ngx_queue_t                    waiters;    /* ngx_http_sluice_ctx_t, FIFO */
    ngx_uint_t                     n_idle;
    ngx_uint_t                     n_reserved;
    ngx_uint_t                     n_leased;
    ngx_uint_t                     n_waiting;
    ngx_uint_t                     credit;     /* asked for, not yet received */
    ngx_uint_t                     recall;     /* sessions the acceptor asked back */

    ngx_http_sluice_stats_t        stats;
};


/* A location's sluice_pass: the upstream it names, found once http{} is read. */
typedef struct {
    ngx_str_t                      name;
    ngx_http_sluice_upstream_t    *up;
    u_char                        *file;       /* where it was written, for errors */
    ngx_uint_t                     line;
} ngx_http_sluice_pass_t;


typedef struct {
    ngx_http_sluice_pass_t        *pass;       /* NULL: no sluice_pass here */
} ngx_http_sluice_loc_conf_t;


typedef struct {
    ngx_array_t                    upstreams;  /* ngx_http_sluice_upstream_t * */
    ngx_array_t                    passes;     /* ngx_http_sluice_pass_t * */
} ngx_http_sluice_main_conf_t;


extern ngx_module_t  ngx_http_sluice_module;


/* ngx_http_sluice_balancer.c */
ngx_int_t ngx_http_sluice_precontent(ngx_http_request_t *r);
ngx_int_t ngx_http_sluice_init_peer(ngx_http_request_t *r,
    ngx_http_upstream_srv_conf_t *us);

/* ngx_http_sluice_status.c */
ngx_int_t ngx_http_sluice_status_handler(ngx_http_request_t *r);

/* ngx_http_sluice_client.c */
ngx_int_t ngx_http_sluice_stamp_client(ngx_http_request_t *r);

/* ngx_http_sluice_handoff.c */
void ngx_http_sluice_handoff_start(ngx_http_sluice_upstream_t *up);
void ngx_http_sluice_handoff_stop(ngx_http_sluice_upstream_t *up);
ngx_int_t ngx_http_sluice_send(ngx_http_sluice_upstream_t *up, u_char *line,
    size_t len, ngx_socket_t fd);

/* ngx_http_sluice_pool.c */
extern const ngx_http_sluice_events_t  ngx_http_sluice_pool_events;

void ngx_http_sluice_want_credit(ngx_http_sluice_upstream_t *up);
ngx_http_sluice_session_t *ngx_http_sluice_take(ngx_http_sluice_upstream_t *up);
void ngx_http_sluice_release(ngx_http_sluice_session_t *s);
void ngx_http_sluice_discard(ngx_http_sluice_session_t *s, ngx_uint_t close);
void ngx_http_sluice_close_all(ngx_http_sluice_upstream_t *up);
ngx_uint_t ngx_http_sluice_none_registered(ngx_http_sluice_upstream_t *up);
ngx_int_t ngx_http_sluice_enqueue(ngx_http_sluice_ctx_t *ctx, ngx_msec_t timeout);
void ngx_http_sluice_dequeue(ngx_http_sluice_ctx_t *ctx);


#endif /* _NGX_HTTP_SLUICE_H_INCLUDED_ */
