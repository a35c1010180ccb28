/*
 * The worker's sessions of one upstream: the idle ones, sessions reserved for or leased to
 * requests, the FIFO admission queue, and the rules for where a session goes when a request
 * is done with it.
 *
 * Which idle session serves next is the Sluice proxy's rule (docs/design.md, "Leasing"): the
 * instances take turns as in a FIFO ring of the idle sessions (a pooled session's turn goes
 * to the tail of up->turns, a lease takes the turn at the head), which rotates requests
 * across instances in proportion to their idle sessions; within the instance whose turn it
 * is, the session pooled last serves. A worker that holds hundreds of sessions keeps the few
 * its load needs warm instead of cycling through all of them, whose sockets and service
 * threads would each be cold (issue 34: 1.13-1.20x the CPU per request of NGINX's own
 * keepalive cache, which is most recently used first).
 *
 * A session is in exactly one place: idle (IDLE: its instance's stack, with a turn of its own
 * in up->turns) or up->busy (RESERVED, LEASED); the counters n_idle, n_reserved and n_leased
 * always equal how many are in each. A session leaves the worker by RETURN (its fd goes back
 * to the acceptor) or GONE (closed here).
 *
 * What the acceptor sends (SESSION, RECALL, DRAIN) arrives through
 * ngx_http_sluice_pool_events; what goes to it (CREDIT, RETURN, GONE) leaves through
 * ngx_http_sluice_send() of the handoff connection below.
 */

#include "ngx_http_sluice.h"


static void ngx_http_sluice_adopt(ngx_http_sluice_upstream_t *up, uint64_t id,
    u_char *instance, size_t instance_len, ngx_socket_t fd);
static void ngx_http_sluice_recall(ngx_http_sluice_upstream_t *up, ngx_uint_t n);
static void ngx_http_sluice_drain(ngx_http_sluice_upstream_t *up, u_char *instance,
    size_t len);
static ngx_uint_t ngx_http_sluice_busy(ngx_http_sluice_upstream_t *up);
static void ngx_http_sluice_slice(ngx_http_sluice_upstream_t *up, ngx_uint_t empty);
static void ngx_http_sluice_link(ngx_http_sluice_session_t *s,
    ngx_http_sluice_state_e state);
static void ngx_http_sluice_unlink(ngx_http_sluice_session_t *s);
static void ngx_http_sluice_pool_idle(ngx_http_sluice_session_t *s);
static void ngx_http_sluice_give_back(ngx_http_sluice_session_t *s);
static void ngx_http_sluice_grant(ngx_http_sluice_upstream_t *up,
    ngx_http_sluice_session_t *s);
static void ngx_http_sluice_idle_handler(ngx_event_t *ev);
static void ngx_http_sluice_dummy_handler(ngx_event_t *ev);
static void ngx_http_sluice_close_session(ngx_http_sluice_session_t *s);
static ngx_http_sluice_session_t *ngx_http_sluice_next_idle(
    ngx_http_sluice_upstream_t *up);
static ngx_http_sluice_instance_t *ngx_http_sluice_find_instance(
    ngx_http_sluice_upstream_t *up, u_char *name, size_t len);
static ngx_http_sluice_instance_t *ngx_http_sluice_hold_instance(
    ngx_http_sluice_upstream_t *up, u_char *name, size_t len);
static void ngx_http_sluice_release_instance(ngx_http_sluice_instance_t *in);
static void ngx_http_sluice_free_session(ngx_http_sluice_session_t *s);
static void ngx_http_sluice_unregister(ngx_connection_t *c);


/* What the handoff connection reports lands here. */
const ngx_http_sluice_events_t  ngx_http_sluice_pool_events = {
    ngx_http_sluice_want_credit,
    ngx_http_sluice_adopt,
    ngx_http_sluice_recall,
    ngx_http_sluice_drain,
    ngx_http_sluice_slice,
    ngx_http_sluice_busy
};


static void
ngx_http_sluice_link(ngx_http_sluice_session_t *s, ngx_http_sluice_state_e state)
{
    ngx_http_sluice_upstream_t  *up = s->up;

    s->state = state;

    switch (state) {
    case NGX_HTTP_SLUICE_IDLE:
        ngx_queue_insert_head(&s->instance->idle, &s->queue);
        ngx_queue_insert_tail(&up->turns, &s->turn);
        up->n_idle++;
        break;
    case NGX_HTTP_SLUICE_RESERVED:
        ngx_queue_insert_tail(&up->busy, &s->queue);
        up->n_reserved++;
        break;
    case NGX_HTTP_SLUICE_LEASED:
        ngx_queue_insert_tail(&up->busy, &s->queue);
        up->n_leased++;
        break;
    }
}


static void
ngx_http_sluice_unlink(ngx_http_sluice_session_t *s)
{
    ngx_http_sluice_upstream_t  *up = s->up;

    ngx_queue_remove(&s->queue);

    switch (s->state) {
    case NGX_HTTP_SLUICE_IDLE:
        ngx_queue_remove(&s->turn);
        up->n_idle--;
        break;
    case NGX_HTTP_SLUICE_RESERVED:
        up->n_reserved--;
        break;
    case NGX_HTTP_SLUICE_LEASED:
        up->n_leased--;
        break;
    }
}


/*
 * A SESSION arrived with its fd: wrap it in a connection and put it where it is needed.
 * On failure the fd is closed here and the acceptor told GONE.
 */
static void
ngx_http_sluice_adopt(ngx_http_sluice_upstream_t *up, uint64_t id, u_char *instance,
    size_t instance_len, ngx_socket_t fd)
{
    int                          on = 1;
    u_char                       line[NGX_HTTP_SLUICE_MAX_LINE];
    ngx_connection_t            *c;
    ngx_http_sluice_session_t   *s;

    s = ngx_calloc(sizeof(ngx_http_sluice_session_t), ngx_cycle->log);
    c = s ? ngx_get_connection(fd, ngx_cycle->log) : NULL;

    if (c == NULL || ngx_nonblocking(fd) == -1) {
        goto failed;
    }

    /* Sessions are TCP (or UNIX stream) sockets; requests are small and latency matters. */
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on)) == 0) {
        c->tcp_nodelay = NGX_TCP_NODELAY_SET;
    }

    c->recv = ngx_recv;
    c->send = ngx_send;
    c->recv_chain = ngx_recv_chain;
    c->send_chain = ngx_send_chain;
    c->sendfile = 1;
    c->type = SOCK_STREAM;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);
    c->read->log = c->log;
    c->write->log = c->log;
    /* A fresh, connected socket can be written to at once. */
    c->write->ready = 1;

    /* Events may come before a request takes it (epoll reports it writable at once). */
    c->data = s;
    c->read->handler = ngx_http_sluice_idle_handler;
    c->write->handler = ngx_http_sluice_dummy_handler;

    /*
     * Into the event loop now, as ngx_event_connect_peer() does for a new connection: the
     * upstream module expects a connection it gets with NGX_DONE to be registered already
     * (a cached keepalive one is), and this session may go straight to a waiting request.
     */
    if (ngx_add_conn) {
        if (ngx_add_conn(c) == NGX_ERROR) {
            goto failed;
        }

    } else if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        goto failed;
    }

    s->instance = ngx_http_sluice_hold_instance(up, instance, instance_len);
    if (s->instance == NULL) {
        goto failed;
    }

    s->up = up;
    s->connection = c;
    s->id = id;
    s->epoch = up->epoch;

    up->stats.received++;
    up->empty = 0;  /* a session came: the slice has some */

    /* As if a request had just finished with it: the same rules decide where it goes. */
    ngx_http_sluice_link(s, NGX_HTTP_SLUICE_LEASED);
    ngx_http_sluice_release(s);

    return;

failed:

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "sluice: cannot take session %uL of \"%V\"; closing it",
                  id, &up->name);
    if (c) {
        ngx_close_connection(c);
    } else {
        ngx_close_socket(fd);
    }
    ngx_free(s);
    ngx_http_sluice_send(up, line,
                         ngx_snprintf(line, sizeof(line), "GONE %uL", id) - line, -1);
    up->stats.gone++;
}


/*
 * The idle session whose turn it is: the turn at the head of the ring names an instance, and
 * that instance's session pooled last serves. When the turn belongs to another of the
 * instance's sessions, that one takes over the turn of the session that serves, so each idle
 * session still has a turn of its own and each instance as many turns as idle sessions. The
 * caller takes the session out (unlink) at once; NULL if none is idle.
 */
static ngx_http_sluice_session_t *
ngx_http_sluice_next_idle(ngx_http_sluice_upstream_t *up)
{
    ngx_http_sluice_session_t  *s, *t;

    if (ngx_queue_empty(&up->turns)) {
        return NULL;
    }

    t = ngx_queue_data(ngx_queue_head(&up->turns), ngx_http_sluice_session_t, turn);
    s = ngx_queue_data(ngx_queue_head(&t->instance->idle), ngx_http_sluice_session_t,
                       queue);

    if (s != t) {
        ngx_queue_remove(&t->turn);
        ngx_queue_insert_after(&s->turn, &t->turn);
    }

    return s;
}


/* The idle session whose turn it is, now reserved; NULL if none is idle. */
ngx_http_sluice_session_t *
ngx_http_sluice_take(ngx_http_sluice_upstream_t *up)
{
    ngx_connection_t            *c;
    ngx_http_sluice_session_t   *s;

    s = ngx_http_sluice_next_idle(up);
    if (s == NULL) {
        return NULL;
    }

    ngx_http_sluice_unlink(s);
    ngx_http_sluice_link(s, NGX_HTTP_SLUICE_RESERVED);

    c = s->connection;
    c->idle = 0;

    /* One fewer idle: top the pool up again. */
    ngx_http_sluice_want_credit(up);

    return s;
}


/*
 * A session is free again: a request finished with it (keep-alive, no error), a request
 * that held it in reserve went away, or it just arrived. In order of precedence it is
 * closed (its instance drains), returned (the acceptor recalled it), given to the oldest
 * waiting request, returned (the worker exits, or the pool holds twice `idle`), or pooled.
 *
 * A recall goes ahead of waiting requests, except in an exiting worker: it takes no new
 * requests, so those waiting in it are older than any a new worker has, and they are
 * served first. Its sessions go back once its queue is empty (issue 28: a recall that took
 * them to a new worker's idle pool left these requests to time out).
 */
void
ngx_http_sluice_release(ngx_http_sluice_session_t *s)
{
    ngx_http_sluice_upstream_t  *up = s->up;

    if (s->draining) {
        ngx_http_sluice_discard(s, 1);
        return;
    }

    if (up->recall > 0 && s->epoch == up->epoch && up->hello
        && !(ngx_http_sluice_exiting() && !ngx_queue_empty(&up->waiters)))
    {
        up->recall--;
        up->stats.recalls++;
        ngx_http_sluice_give_back(s);
        ngx_http_sluice_want_credit(up);
        return;
    }

    if (!ngx_queue_empty(&up->waiters)) {
        ngx_http_sluice_grant(up, s);
        return;
    }

    if (ngx_http_sluice_exiting() || up->n_idle >= 2 * up->idle_target)
    {
        ngx_http_sluice_give_back(s);
        return;
    }

    ngx_http_sluice_pool_idle(s);
    ngx_http_sluice_want_credit(up);
}


/* Makes a session idle (on top of its instance's stack, its turn last), watched for EOF like
 * a keepalive connection. */
static void
ngx_http_sluice_pool_idle(ngx_http_sluice_session_t *s)
{
    ngx_connection_t  *c = s->connection;

    ngx_http_sluice_unlink(s);
    ngx_http_sluice_link(s, NGX_HTTP_SLUICE_IDLE);

    c->idle = 1;  /* ngx_close_idle_connections() reaches it on reload and quit */
    c->data = s;
    c->log = ngx_cycle->log;
    c->read->log = ngx_cycle->log;
    c->write->log = ngx_cycle->log;
    if (c->pool) {
        c->pool->log = ngx_cycle->log;
    }

    c->read->delayed = 0;
    c->read->handler = ngx_http_sluice_idle_handler;
    c->write->handler = ngx_http_sluice_dummy_handler;

    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }
    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_sluice_discard(s, 1);
        return;
    }

    if (c->read->ready) {
        /* Something is already there (EOF, or bytes nobody asked for). */
        ngx_http_sluice_idle_handler(c->read);
    }
}


/* The oldest waiting request gets the session; it resumes from the posted events. */
static void
ngx_http_sluice_grant(ngx_http_sluice_upstream_t *up, ngx_http_sluice_session_t *s)
{
    ngx_queue_t            *q;
    ngx_http_sluice_ctx_t  *ctx;

    q = ngx_queue_head(&up->waiters);
    ctx = ngx_queue_data(q, ngx_http_sluice_ctx_t, queue);

    ngx_http_sluice_dequeue(ctx);

    ngx_http_sluice_unlink(s);
    ngx_http_sluice_link(s, NGX_HTTP_SLUICE_RESERVED);
    s->connection->idle = 0;
    ctx->session = s;

    ngx_post_event(&ctx->wake, &ngx_posted_events);
}


/* RETURN: the session's fd goes back to the acceptor that lent it (or is closed when that
 * connection is gone: a new acceptor does not know it). */
static void
ngx_http_sluice_give_back(ngx_http_sluice_session_t *s)
{
    u_char                       line[NGX_HTTP_SLUICE_MAX_LINE], *p;
    ngx_connection_t            *c = s->connection;
    ngx_http_sluice_upstream_t  *up = s->up;

    ngx_http_sluice_unlink(s);

    if (s->epoch == up->epoch && up->handoff && up->hello) {
        /*
         * The acceptor gets a copy of the socket: our epoll registration must go first, or
         * it would outlive our fd (it belongs to the open file, not to the descriptor).
         */
        ngx_http_sluice_unregister(c);

        p = ngx_snprintf(line, sizeof(line), "RETURN %uL", s->id);
        if (ngx_http_sluice_send(up, line, p - line, c->fd) == NGX_OK) {
            up->stats.returned++;
        }
    }

    ngx_http_sluice_close_session(s);
}


/*
 * The session is done for: GONE to the acceptor that lent it. With `close` the connection is
 * closed here; without, its owner (the upstream module, after peer.free) closes it.
 */
void
ngx_http_sluice_discard(ngx_http_sluice_session_t *s, ngx_uint_t close)
{
    u_char                       line[NGX_HTTP_SLUICE_MAX_LINE], *p;
    ngx_http_sluice_upstream_t  *up = s->up;

    ngx_http_sluice_unlink(s);

    if (s->epoch == up->epoch && up->handoff && up->hello) {
        p = ngx_snprintf(line, sizeof(line), "GONE %uL", s->id);
        if (ngx_http_sluice_send(up, line, p - line, -1) == NGX_OK) {
            up->stats.gone++;
        }
    }

    if (close) {
        ngx_http_sluice_close_session(s);
    } else {
        ngx_http_sluice_free_session(s);
    }

    ngx_http_sluice_want_credit(up);
}


static void
ngx_http_sluice_close_session(ngx_http_sluice_session_t *s)
{
    ngx_connection_t  *c = s->connection;

    if (c->pool) {
        ngx_destroy_pool(c->pool);
        c->pool = NULL;
    }

    ngx_close_connection(c);
    ngx_http_sluice_free_session(s);
}


static void
ngx_http_sluice_free_session(ngx_http_sluice_session_t *s)
{
    ngx_http_sluice_release_instance(s->instance);
    ngx_free(s);
}


static ngx_http_sluice_instance_t *
ngx_http_sluice_find_instance(ngx_http_sluice_upstream_t *up, u_char *name, size_t len)
{
    ngx_queue_t                 *q;
    ngx_http_sluice_instance_t  *in;

    for (q = ngx_queue_head(&up->instances); q != ngx_queue_sentinel(&up->instances);
         q = ngx_queue_next(q))
    {
        in = ngx_queue_data(q, ngx_http_sluice_instance_t, queue);
        if (in->len == len && ngx_memcmp(in->name, name, len) == 0) {
            return in;
        }
    }

    return NULL;
}


/* The instance's record, made for its first session here, with one more session counted;
 * NULL if out of memory. */
static ngx_http_sluice_instance_t *
ngx_http_sluice_hold_instance(ngx_http_sluice_upstream_t *up, u_char *name, size_t len)
{
    ngx_http_sluice_instance_t  *in;

    in = ngx_http_sluice_find_instance(up, name, len);

    if (in == NULL) {
        in = ngx_calloc(sizeof(ngx_http_sluice_instance_t), ngx_cycle->log);
        if (in == NULL) {
            return NULL;
        }
        ngx_queue_init(&in->idle);
        in->len = len;
        ngx_memcpy(in->name, name, len);
        ngx_queue_insert_tail(&up->instances, &in->queue);
    }

    in->held++;

    return in;
}


/* One session fewer of the instance; its record goes with the last. */
static void
ngx_http_sluice_release_instance(ngx_http_sluice_instance_t *in)
{
    if (in == NULL || --in->held > 0) {
        return;
    }

    ngx_queue_remove(&in->queue);
    ngx_free(in);
}


/* Removes a connection from the event loop for real (ngx_close_connection() skips the
 * syscall, relying on close() to do it, which is not true of an fd that lives on). */
static void
ngx_http_sluice_unregister(ngx_connection_t *c)
{
    if (c->read->timer_set) {
        ngx_del_timer(c->read);
    }
    if (c->write->timer_set) {
        ngx_del_timer(c->write);
    }

    if (!c->read->active && !c->write->active) {
        return;
    }

    if (ngx_del_conn) {
        ngx_del_conn(c, 0);
        return;
    }

    if (c->read->active) {
        ngx_del_event(c->read, NGX_READ_EVENT, 0);
    }
    if (c->write->active) {
        ngx_del_event(c->write, NGX_WRITE_EVENT, 0);
    }
}


/*
 * An idle session became readable: EOF, an error or bytes nobody asked for all mean it is
 * unusable (GONE). ngx_close_idle_connections() also lands here with c->close set when the
 * worker reloads or quits: then the session goes back to the acceptor for the new workers.
 */
static void
ngx_http_sluice_idle_handler(ngx_event_t *ev)
{
    char                        buf[1];
    ssize_t                     n;
    ngx_connection_t           *c = ev->data;
    ngx_http_sluice_session_t  *s = c->data;

    if (s->state != NGX_HTTP_SLUICE_IDLE) {
        /* Reserved for a request: the upstream module will see whatever is there. */
        return;
    }

    if (c->close) {
        c->close = 0;
        ngx_http_sluice_give_back(s);
        return;
    }

    n = recv(c->fd, buf, 1, MSG_PEEK);

    if (n == -1 && ngx_socket_errno == NGX_EAGAIN) {
        ev->ready = 0;
        if (ngx_handle_read_event(ev, 0) == NGX_OK) {
            return;
        }
    }

    ngx_log_debug1(NGX_LOG_DEBUG_HTTP, c->log, 0,
                   "sluice: idle session %uL closed by its service", s->id);

    ngx_http_sluice_discard(s, 1);
}


static void
ngx_http_sluice_dummy_handler(ngx_event_t *ev)
{
}


/*
 * RECALL: give `n` sessions back, idle ones now, others as they become free. Idle sessions
 * lent by an earlier acceptor are not ours to give to this one: they are passed over (were
 * the loop to stop at one, a recall could wait for as long as that session stayed idle).
 */
static void
ngx_http_sluice_recall(ngx_http_sluice_upstream_t *up, ngx_uint_t n)
{
    ngx_uint_t                   held;
    ngx_queue_t                 *q, *next;
    ngx_http_sluice_session_t   *s;

    /* Never more than we hold: a recall must not outlive the sessions it was about. */
    held = up->n_idle + up->n_reserved + up->n_leased;
    up->recall = ngx_min(up->recall + n, held);

    for (q = ngx_queue_head(&up->turns);
         up->recall > 0 && q != ngx_queue_sentinel(&up->turns);
         q = next)
    {
        next = ngx_queue_next(q);
        s = ngx_queue_data(q, ngx_http_sluice_session_t, turn);
        if (s->epoch != up->epoch) {
            continue;
        }
        up->recall--;
        up->stats.recalls++;
        ngx_http_sluice_give_back(s);
    }

    ngx_http_sluice_want_credit(up);
}


/* DRAIN: lease that instance's sessions no more; idle ones close now, busy ones after
 * their responses (release() sees `draining`). */
static void
ngx_http_sluice_drain(ngx_http_sluice_upstream_t *up, u_char *instance, size_t len)
{
    ngx_queue_t                 *q;
    ngx_http_sluice_session_t   *s;
    ngx_http_sluice_instance_t  *in;

    up->stats.drains++;

    in = ngx_http_sluice_find_instance(up, instance, len);
    if (in == NULL) {
        return;
    }

    for (q = ngx_queue_head(&up->busy); q != ngx_queue_sentinel(&up->busy);
         q = ngx_queue_next(q))
    {
        s = ngx_queue_data(q, ngx_http_sluice_session_t, queue);
        if (s->instance == in) {
            s->draining = 1;
        }
    }

    /* Held here, so that the record outlives its last idle session's discard. */
    in->held++;

    while (!ngx_queue_empty(&in->idle)) {
        s = ngx_queue_data(ngx_queue_head(&in->idle), ngx_http_sluice_session_t, queue);
        ngx_http_sluice_discard(s, 1);
    }

    ngx_http_sluice_release_instance(in);
}


/*
 * Asks for credit so that idle sessions plus outstanding credit cover `idle` plus every
 * waiting request (an exiting worker asks only for its waiting requests).
 */
void
ngx_http_sluice_want_credit(ngx_http_sluice_upstream_t *up)
{
    u_char      line[NGX_HTTP_SLUICE_MAX_LINE], *p;
    ngx_uint_t  target, have, more;

    if (up->handoff == NULL || !up->hello) {
        return;
    }

    target = up->n_waiting;
    if (!ngx_http_sluice_exiting()) {
        target += up->idle_target;
    }

    have = up->n_idle + up->credit;
    if (target <= have) {
        return;
    }

    more = ngx_min(target - have, 0xffffffff);

    p = ngx_snprintf(line, sizeof(line), "CREDIT %V %V %ui",
                     &up->cluster, &up->slice, more);

    if (ngx_http_sluice_send(up, line, p - line, -1) == NGX_OK) {
        up->credit += more;
    }
}


/* Whether a request holds a session (reserved or leased) or waits for one. */
static ngx_uint_t
ngx_http_sluice_busy(ngx_http_sluice_upstream_t *up)
{
    return up->n_leased || up->n_reserved || up->n_waiting;
}


/* The worker exits: close what is left (the acceptor forgets a consumer that leaves). */
void
ngx_http_sluice_close_all(ngx_http_sluice_upstream_t *up)
{
    ngx_queue_t                 *q;
    ngx_http_sluice_session_t   *s;

    while (!ngx_queue_empty(&up->turns)) {
        q = ngx_queue_head(&up->turns);
        s = ngx_queue_data(q, ngx_http_sluice_session_t, turn);
        ngx_http_sluice_unlink(s);
        ngx_http_sluice_close_session(s);
    }

    /* Busy sessions belong to requests that the exit is ending; their connections are
     * closed by the upstream module, and peer.free finds them already forgotten. */
    while (!ngx_queue_empty(&up->busy)) {
        q = ngx_queue_head(&up->busy);
        s = ngx_queue_data(q, ngx_http_sluice_session_t, queue);
        ngx_http_sluice_unlink(s);
        if (s->state == NGX_HTTP_SLUICE_RESERVED) {
            ngx_http_sluice_close_session(s);
        } else {
            s->up = NULL;
        }
    }
}


/*
 * SLICE: whether the acceptor has any session of our slice (idle there or lent to any
 * consumer). While it has none and this worker holds none either, requests are refused at
 * once (unless no_sessions_wait), and so are those already waiting: nothing will serve them
 * until a service registers.
 */
static void
ngx_http_sluice_slice(ngx_http_sluice_upstream_t *up, ngx_uint_t empty)
{
    ngx_queue_t            *q;
    ngx_http_sluice_ctx_t  *ctx;

    if (up->empty != empty) {
        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      empty ? "sluice: no sessions registered for upstream \"%V\" "
                              "(%V/%V): requests get 503 until a service registers"
                            : "sluice: sessions registered again for upstream \"%V\" "
                              "(%V/%V)",
                      &up->name, &up->cluster, &up->slice);
    }

    up->empty = empty;

    if (!ngx_http_sluice_none_registered(up) || up->no_sessions_wait) {
        return;
    }

    while (!ngx_queue_empty(&up->waiters)) {
        q = ngx_queue_head(&up->waiters);
        ctx = ngx_queue_data(q, ngx_http_sluice_ctx_t, queue);
        ngx_http_sluice_dequeue(ctx);
        ctx->no_sessions = 1;
        ngx_post_event(&ctx->wake, &ngx_posted_events);
    }
}


/* Whether no session of the slice is registered anywhere, as far as this worker knows: the
 * acceptor said so, and this worker holds none (not even one of an earlier acceptor). */
ngx_uint_t
ngx_http_sluice_none_registered(ngx_http_sluice_upstream_t *up)
{
    return up->empty && up->n_idle + up->n_reserved + up->n_leased == 0;
}


/* Parks a request at the tail of the queue for at most `timeout`; NGX_DECLINED when the
 * queue is full. */
ngx_int_t
ngx_http_sluice_enqueue(ngx_http_sluice_ctx_t *ctx, ngx_msec_t timeout)
{
    ngx_http_sluice_upstream_t  *up = ctx->up;

    if (up->n_waiting >= up->queue_max) {
        return NGX_DECLINED;
    }

    ngx_queue_insert_tail(&up->waiters, &ctx->queue);
    up->n_waiting++;
    up->stats.queued++;
    ctx->waiting = 1;

    ngx_add_timer(&ctx->wake, timeout);

    /* Every waiting request counts toward the credit we ask for. */
    ngx_http_sluice_want_credit(up);

    return NGX_OK;
}


/* Takes a request out of the queue (granted, timed out, or gone). */
void
ngx_http_sluice_dequeue(ngx_http_sluice_ctx_t *ctx)
{
    if (ctx->waiting) {
        ngx_queue_remove(&ctx->queue);
        ctx->up->n_waiting--;
        ctx->waiting = 0;
    }

    if (ctx->wake.timer_set) {
        ngx_del_timer(&ctx->wake);
    }
}
