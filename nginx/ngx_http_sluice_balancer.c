/*
 * Admission and the balancer. A request whose location sluice_passes to a sluice_sessions
 * upstream first has its body read (so that a slow upload holds no session), then reserves
 * an idle session of the worker's pool in the precontent phase (after access checks), or
 * waits for one in a FIFO queue (bounded by `queue` and `queue_timeout`; then 503 with
 * Retry-After), and gets its Sluice-Client-Addr (ngx_http_sluice_client.c). The balancer's
 * peer.get hands the reserved session's connection to the upstream module with NGX_DONE, as
 * the keepalive module does with a cached connection: no connect(), no blocking call.
 * peer.free gives a reusable session back to the pool and reports an unusable one GONE. A
 * session serves one request at a time.
 */

#include "ngx_http_sluice.h"


/* Why a request gets 503: the bodies the Sluice proxy sends for the same reasons. */
static ngx_str_t  ngx_http_sluice_queue_full =
    ngx_string("no capacity: admission queue full\n");
static ngx_str_t  ngx_http_sluice_wait_expired =
    ngx_string("no capacity: queue wait expired\n");
static ngx_str_t  ngx_http_sluice_no_sessions =
    ngx_string("no sessions registered for this service\n");
/*
 * Why a request gets 502: the worker waited with no session and no connection to the
 * acceptor, so it cannot know whether any session exists. As NGINX answers an upstream it
 * cannot connect to: the fault is between the proxy and its upstream, not the service's
 * capacity, and monitoring that tells 502 from 503 should page for it rather than back off.
 */
static ngx_str_t  ngx_http_sluice_unreachable =
    ngx_string("acceptor unreachable\n");


typedef struct {
    ngx_http_sluice_upstream_t  *up;
    ngx_http_request_t          *request;
    ngx_http_sluice_session_t   *session;   /* leased to this request */
} ngx_http_sluice_peer_data_t;


static ngx_int_t ngx_http_sluice_get_peer(ngx_peer_connection_t *pc, void *data);
static void ngx_http_sluice_free_peer(ngx_peer_connection_t *pc, void *data,
    ngx_uint_t state);

static ngx_int_t ngx_http_sluice_admit(ngx_http_request_t *r,
    ngx_http_sluice_ctx_t *ctx);
static void ngx_http_sluice_body_read(ngx_http_request_t *r);
static ngx_int_t ngx_http_sluice_reject(ngx_http_request_t *r,
    ngx_http_sluice_upstream_t *up, ngx_uint_t status, ngx_str_t *reason);
static ngx_uint_t ngx_http_sluice_has_error_page(ngx_http_request_t *r,
    ngx_uint_t status);
static void ngx_http_sluice_wake(ngx_event_t *ev);
static void ngx_http_sluice_cleanup(void *data);


/* ---- admission: the body, then a session before the upstream starts, or a wait ------ */


/* The upstream a request's location sluice_passes to, or NULL. */
static ngx_http_sluice_upstream_t *
ngx_http_sluice_upstream_of(ngx_http_request_t *r)
{
    ngx_http_sluice_loc_conf_t  *slcf;

    slcf = ngx_http_get_module_loc_conf(r, ngx_http_sluice_module);

    if (slcf->pass == NULL || slcf->pass->up->out == NULL) {
        return NULL;
    }

    return slcf->pass->up;
}


/*
 * Runs (again) until the request holds a session: first the body is read in full, then an
 * idle session is reserved or the request waits in the queue. Re-entered from
 * ngx_http_sluice_body_read() and ngx_http_sluice_wake().
 */
ngx_int_t
ngx_http_sluice_precontent(ngx_http_request_t *r)
{
    ngx_int_t                    rc;
    ngx_pool_cleanup_t          *cln;
    ngx_http_sluice_ctx_t       *ctx;
    ngx_http_sluice_upstream_t  *up;

    up = ngx_http_sluice_upstream_of(r);
    if (up == NULL) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_get_module_ctx(r, ngx_http_sluice_module);

    if (ctx) {
        if (ctx->reading_body) {
            return NGX_DONE;
        }
        if (!ctx->admitted) {
            return ngx_http_sluice_admit(r, ctx);
        }
        if (ctx->waiting) {
            return NGX_AGAIN;
        }
        if ((ctx->timed_out || ctx->no_sessions) && ctx->session == NULL) {
            if (ctx->no_sessions || ngx_http_sluice_none_registered(up)) {
                return ngx_http_sluice_reject(r, up, NGX_HTTP_SERVICE_UNAVAILABLE,
                                              &ngx_http_sluice_no_sessions);
            }
            if (up->handoff == NULL || !up->hello) {
                ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                              "sluice: no session after waiting and the acceptor at "
                              "\"%V\" is unreachable (upstream \"%V\"): is it running?",
                              &up->path, &up->name);
                return ngx_http_sluice_reject(r, up, NGX_HTTP_BAD_GATEWAY,
                                              &ngx_http_sluice_unreachable);
            }
            return ngx_http_sluice_reject(r, up, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          &ngx_http_sluice_wait_expired);
        }
        return NGX_DECLINED;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_sluice_ctx_t));
    if (ctx == NULL) {
        return NGX_ERROR;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NGX_ERROR;
    }

    ctx->up = up;
    ctx->request = r;
    ctx->wake.handler = ngx_http_sluice_wake;
    ctx->wake.data = ctx;
    ctx->wake.log = r->connection->log;

    cln->handler = ngx_http_sluice_cleanup;
    cln->data = ctx;

    ngx_http_set_ctx(r, ctx, ngx_http_sluice_module);

    if (ngx_http_sluice_stamp_client(r) != NGX_OK) {
        return NGX_ERROR;
    }

    if (r != r->main || r->request_body
        || (r->headers_in.content_length_n <= 0 && !r->headers_in.chunked))
    {
        return ngx_http_sluice_admit(r, ctx);
    }

    /* The body first, at the client's speed; as the mirror module does it. */
    ctx->reading_body = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_sluice_body_read);
    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);
    return NGX_DONE;
}


static void
ngx_http_sluice_body_read(ngx_http_request_t *r)
{
    ngx_http_sluice_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_sluice_module);
    if (ctx) {
        ctx->reading_body = 0;
    }

    r->preserve_body = 1;  /* proxy_pass reads it from here */
    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


/*
 * An idle session now, or a place in the queue, or 503. While no session of the slice is
 * registered at all, the request gets 503 at once, or waits at most no_sessions_wait.
 */
static ngx_int_t
ngx_http_sluice_admit(ngx_http_request_t *r, ngx_http_sluice_ctx_t *ctx)
{
    ngx_msec_t                   timeout;
    ngx_http_sluice_upstream_t  *up = ctx->up;

    ctx->admitted = 1;

    ctx->session = ngx_http_sluice_take(up);
    if (ctx->session) {
        return NGX_DECLINED;
    }

    timeout = up->queue_timeout;

    if (ngx_http_sluice_none_registered(up)) {
        if (up->no_sessions_wait == 0) {
            return ngx_http_sluice_reject(r, up, NGX_HTTP_SERVICE_UNAVAILABLE,
                                          &ngx_http_sluice_no_sessions);
        }
        timeout = ngx_min(timeout, up->no_sessions_wait);
    }

    if (ngx_http_sluice_enqueue(ctx, timeout) != NGX_OK) {
        return ngx_http_sluice_reject(r, up, NGX_HTTP_SERVICE_UNAVAILABLE,
                                      &ngx_http_sluice_queue_full);
    }

    /* Parked: a session or the timeout wakes it; a client that leaves ends it. */
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_http_request_empty_handler;

    return NGX_AGAIN;
}


/*
 * 503 with Retry-After: the queue is full, the wait was too long, or no session is
 * registered; or 502 (no Retry-After: waiting is not known to help) when the acceptor was
 * unreachable. `reason` is the body, as the Sluice proxy sends it, unless the location has
 * an error_page for that status (then that page).
 */
static ngx_int_t
ngx_http_sluice_reject(ngx_http_request_t *r, ngx_http_sluice_upstream_t *up,
    ngx_uint_t status, ngx_str_t *reason)
{
    ngx_int_t                  rc;
    ngx_str_t                  type = ngx_string("text/plain");
    ngx_table_elt_t           *h;
    ngx_http_complex_value_t   cv;

    up->stats.rejected++;

    if (status == NGX_HTTP_SERVICE_UNAVAILABLE) {
        h = ngx_list_push(&r->headers_out.headers);
        if (h == NULL) {
            return NGX_ERROR;
        }

        h->hash = 1;
        ngx_str_set(&h->key, "Retry-After");
        ngx_str_set(&h->value, "1");
    }

    if (ngx_http_sluice_has_error_page(r, status)) {
        return status;
    }

    ngx_memzero(&cv, sizeof(ngx_http_complex_value_t));
    cv.value = *reason;

    /*
     * Sent, the request ends here. Returned to the precontent phase, NGX_OK would move on to
     * the content phase, whose proxy then found no session ("no live upstreams") and tried
     * to send a 502 after the 503 ("header already sent").
     */
    rc = ngx_http_send_response(r, status, &type, &cv);
    ngx_http_finalize_request(r, rc);
    return NGX_DONE;
}


static ngx_uint_t
ngx_http_sluice_has_error_page(ngx_http_request_t *r, ngx_uint_t status)
{
    ngx_uint_t                 i;
    ngx_http_err_page_t       *page;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
    if (clcf->error_pages == NULL) {
        return 0;
    }

    page = clcf->error_pages->elts;
    for (i = 0; i < clcf->error_pages->nelts; i++) {
        if (page[i].status == (ngx_int_t) status) {
            return 1;
        }
    }

    return 0;
}


/* A parked request resumes: a session was granted to it or the slice has none (posted), or
 * its time is up. */
static void
ngx_http_sluice_wake(ngx_event_t *ev)
{
    ngx_connection_t       *c;
    ngx_http_request_t     *r;
    ngx_http_sluice_ctx_t  *ctx = ev->data;

    r = ctx->request;
    c = r->connection;

    if (ev->timedout) {
        ev->timedout = 0;
        ngx_http_sluice_dequeue(ctx);
        ctx->timed_out = 1;
    }

    ngx_http_set_log_request(c->log, r);

    r->read_event_handler = ngx_http_block_reading;
    r->write_event_handler = ngx_http_core_run_phases;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


/* The request is gone: out of the queue, and an unused reservation goes back. */
static void
ngx_http_sluice_cleanup(void *data)
{
    ngx_http_sluice_ctx_t      *ctx = data;
    ngx_http_sluice_session_t  *s;

    ngx_http_sluice_dequeue(ctx);

    if (ctx->wake.posted) {
        ngx_delete_posted_event(&ctx->wake);
    }

    s = ctx->session;
    ctx->session = NULL;

    if (s && s->up) {
        ngx_http_sluice_release(s);
    }
}


/* ---- the balancer: peer.get / peer.free ------------------------------------------------ */


ngx_int_t
ngx_http_sluice_init_peer(ngx_http_request_t *r, ngx_http_upstream_srv_conf_t *us)
{
    ngx_http_sluice_ctx_t        *ctx;
    ngx_http_sluice_upstream_t   *up;
    ngx_http_sluice_peer_data_t  *sp;

    up = ngx_http_conf_upstream_srv_conf(us, ngx_http_sluice_module);

    /*
     * Only a request admitted by sluice_pass goes over a session: it carries the client's
     * Sluice-Client-Addr (services trust it), and it waited for its session. One that came
     * another way (proxy_pass, grpc_pass, ...) would carry whatever the client sent.
     */
    ctx = ngx_http_get_module_ctx(r, ngx_http_sluice_module);
    if (ctx == NULL || ctx->up != up) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "sluice: upstream \"%V\" takes requests from sluice_pass only; "
                      "write \"sluice_pass http://%V;\" in this location instead of "
                      "proxy_pass", &up->name, &up->name);
        return NGX_ERROR;
    }

    sp = ngx_pcalloc(r->pool, sizeof(ngx_http_sluice_peer_data_t));
    if (sp == NULL) {
        return NGX_ERROR;
    }

    sp->up = up;
    sp->request = r;

    r->upstream->peer.data = sp;
    r->upstream->peer.get = ngx_http_sluice_get_peer;
    r->upstream->peer.free = ngx_http_sluice_free_peer;
    /* A second try (proxy_next_upstream) takes another idle session if there is one. */
    r->upstream->peer.tries = 2;

    return NGX_OK;
}


/* The reserved session (or, on a retry, any idle one) with NGX_DONE: a connected socket,
 * as the keepalive module hands out a cached one. NGX_BUSY when there is none. */
static ngx_int_t
ngx_http_sluice_get_peer(ngx_peer_connection_t *pc, void *data)
{
    ngx_http_sluice_peer_data_t  *sp = data;

    ngx_connection_t            *c;
    ngx_http_sluice_ctx_t       *ctx;
    ngx_http_sluice_session_t   *s;
    ngx_http_sluice_upstream_t  *up = sp->up;

    pc->sockaddr = (struct sockaddr *) &up->sockaddr;
    pc->socklen = sizeof(struct sockaddr_un);
    pc->name = &up->peer_name;

    s = NULL;
    ctx = ngx_http_get_module_ctx(sp->request, ngx_http_sluice_module);

    if (ctx && ctx->up == up && ctx->session) {
        s = ctx->session;
        ctx->session = NULL;
    } else {
        s = ngx_http_sluice_take(up);
    }

    if (s == NULL) {
        ngx_log_error(NGX_LOG_ERR, pc->log, 0,
                      "sluice: no idle session for upstream \"%V\"", &up->name);
        return NGX_BUSY;
    }

    /* RESERVED -> LEASED: the upstream module owns the connection until peer.free. */
    ngx_queue_remove(&s->queue);
    up->n_reserved--;
    ngx_queue_insert_tail(&up->busy, &s->queue);
    up->n_leased++;
    s->state = NGX_HTTP_SLUICE_LEASED;
    up->stats.served++;

    c = s->connection;
    c->idle = 0;
    c->sent = 0;
    c->data = NULL;
    c->log = pc->log;
    c->read->log = pc->log;
    c->write->log = pc->log;
    if (c->pool) {
        c->pool->log = pc->log;
    }

    sp->session = s;
    pc->connection = c;
    pc->cached = 1;

    return NGX_DONE;
}


/*
 * The request is done with its session. A clean keep-alive end puts it back in the pool
 * (or wherever ngx_http_sluice_release() sends it); anything else makes it GONE, and the
 * upstream module closes the connection itself.
 */
static void
ngx_http_sluice_free_peer(ngx_peer_connection_t *pc, void *data, ngx_uint_t state)
{
    ngx_http_sluice_peer_data_t  *sp = data;

    ngx_connection_t            *c;
    ngx_http_upstream_t         *u;
    ngx_http_sluice_session_t   *s;

    s = sp->session;
    sp->session = NULL;

    if (s == NULL || s->up == NULL) {
        return;
    }

    c = pc->connection;
    u = sp->request->upstream;

    if (state & NGX_PEER_FAILED
        || c == NULL
        || c != s->connection
        || c->read->eof
        || c->read->error
        || c->read->timedout
        || c->write->error
        || c->write->timedout
        || !u->keepalive
        || !u->request_body_sent
        || ngx_terminate)
    {
        goto gone;
    }

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        goto gone;
    }

    pc->connection = NULL;
    ngx_http_sluice_release(s);

    return;

gone:

    ngx_http_sluice_discard(s, 0);
}
