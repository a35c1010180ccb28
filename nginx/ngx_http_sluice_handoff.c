/*
 * The worker's connection to the acceptor's handoff socket (docs/handoff.md): a
 * non-blocking UNIX SOCK_SEQPACKET socket in the worker's event loop. One datagram is one
 * message of at most 512 bytes; a session's fd rides beside its SESSION (or RETURN) in
 * SCM_RIGHTS. Anything out of place -- a truncated datagram, an fd where none belongs, a
 * malformed word, a SESSION beyond our credit -- is a protocol error: every fd that came
 * with it is closed, and so is the connection. We reconnect with backoff; the sessions we
 * hold keep serving meanwhile.
 */

#include "ngx_http_sluice.h"


/* At most one fd may come with a message; room for a few more lets us see (and close)
 * every fd a broken or hostile peer sends instead of having the kernel truncate. */
#define NGX_HTTP_SLUICE_MAX_FDS  8

#define NGX_HTTP_SLUICE_MAX_WORDS  6


typedef struct {
    ngx_str_t   word[NGX_HTTP_SLUICE_MAX_WORDS];
    ngx_uint_t  n;
} ngx_http_sluice_words_t;


static void ngx_http_sluice_reconnect_handler(ngx_event_t *ev);
static void ngx_http_sluice_read_handler(ngx_event_t *ev);
static void ngx_http_sluice_write_handler(ngx_event_t *ev);
static void ngx_http_sluice_flush_handler(ngx_event_t *ev);
static void ngx_http_sluice_linger_handler(ngx_event_t *ev);
static void ngx_http_sluice_disconnect(ngx_http_sluice_upstream_t *up,
    const char *why);
static void ngx_http_sluice_refused(ngx_http_sluice_upstream_t *up);
static void ngx_http_sluice_schedule(ngx_http_sluice_upstream_t *up);
static ngx_int_t ngx_http_sluice_flush(ngx_http_sluice_upstream_t *up);
static ssize_t ngx_http_sluice_sendmsg(ngx_socket_t s, u_char *line, size_t len,
    ngx_socket_t fd);
static const char *ngx_http_sluice_handle(ngx_http_sluice_upstream_t *up,
    u_char *line, size_t len, ngx_socket_t *fds, ngx_uint_t nfds);
static const char *ngx_http_sluice_split(u_char *line, size_t len,
    ngx_http_sluice_words_t *w);
static ngx_int_t ngx_http_sluice_number(ngx_str_t *word, uint64_t max,
    uint64_t *out);
static ngx_int_t ngx_http_sluice_is_ours(ngx_http_sluice_upstream_t *up,
    ngx_str_t *cluster, ngx_str_t *slice);


/* Connects (again). Failure is not an error: the acceptor may not be up yet. */
void
ngx_http_sluice_handoff_start(ngx_http_sluice_upstream_t *up)
{
    ngx_err_t          err;
    ngx_socket_t       s;
    ngx_connection_t  *c;

    if (up->handoff || ngx_http_sluice_exiting()) {
        return;
    }

    s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s == (ngx_socket_t) -1) {
        ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, ngx_socket_errno,
                      "sluice: socket(AF_UNIX, SOCK_SEQPACKET) failed");
        ngx_http_sluice_schedule(up);
        return;
    }

    /* A UNIX connect() completes at once or fails (EAGAIN: the backlog is full). */
    if (connect(s, (struct sockaddr *) &up->sockaddr, sizeof(struct sockaddr_un))
        == -1)
    {
        err = ngx_socket_errno;
        if (err == NGX_EACCES || err == NGX_EPERM) {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, err,
                          "sluice: this worker (uid %d, gid %d) may not open the acceptor's "
                          "socket \"%V\" for upstream \"%V\": in the acceptor's [handoff] "
                          "set mode = \"0660\" and group = a group of this worker's user "
                          "(or its gid %d), list uid %d in allowed_uids, and let this user "
                          "through the socket's directories; retrying in %M ms",
                          (int) geteuid(), (int) getegid(), &up->path, &up->name,
                          (int) getegid(), (int) geteuid(), up->backoff);
        } else {
            ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, err,
                          "sluice: cannot connect to the acceptor at \"%V\" "
                          "for upstream \"%V\"; retrying in %M ms",
                          &up->path, &up->name, up->backoff);
        }
        ngx_close_socket(s);
        ngx_http_sluice_schedule(up);
        return;
    }

    c = ngx_get_connection(s, ngx_cycle->log);
    if (c == NULL) {
        ngx_close_socket(s);
        ngx_http_sluice_schedule(up);
        return;
    }

    c->data = up;
    c->number = ngx_atomic_fetch_add(ngx_connection_counter, 1);
    c->read->handler = ngx_http_sluice_read_handler;
    c->write->handler = ngx_http_sluice_write_handler;
    c->read->log = c->log;
    c->write->log = c->log;
    c->write->ready = 1;
    /*
     * Not an idle connection, but marked as one so that ngx_close_idle_connections() calls
     * the read handler with c->close set when the worker starts to exit (reload, quit):
     * that is where its last duties begin (ngx_http_sluice_linger_handler).
     */
    c->idle = 1;

    up->handoff = c;
    up->hello = 0;
    up->out_head = 0;
    up->out_count = 0;

    if (ngx_handle_read_event(c->read, 0) != NGX_OK) {
        ngx_http_sluice_disconnect(up, "cannot watch the socket");
        return;
    }

    (void) ngx_http_sluice_send(up, (u_char *) "HELLO 1 consumer",
                                sizeof("HELLO 1 consumer") - 1, -1);
}


/* The worker exits: close the connection for good. */
void
ngx_http_sluice_handoff_stop(ngx_http_sluice_upstream_t *up)
{
    if (up->reconnect.timer_set) {
        ngx_del_timer(&up->reconnect);
    }

    if (up->handoff) {
        ngx_http_sluice_disconnect(up, NULL);
    }

    if (up->reconnect.timer_set) {
        ngx_del_timer(&up->reconnect);
    }
}


static void
ngx_http_sluice_schedule(ngx_http_sluice_upstream_t *up)
{
    if (ngx_http_sluice_exiting() || up->reconnect.timer_set) {
        return;
    }

    up->reconnect.handler = ngx_http_sluice_reconnect_handler;
    up->reconnect.data = up;
    up->reconnect.log = ngx_cycle->log;
    /* Waiting to reconnect must not keep an exiting worker alive. */
    up->reconnect.cancelable = 1;

    ngx_add_timer(&up->reconnect, up->backoff);

    up->backoff = ngx_min(up->backoff * 2, NGX_HTTP_SLUICE_BACKOFF_MAX);
}


static void
ngx_http_sluice_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_sluice_handoff_start(ev->data);
}


/*
 * Closes the connection and every fd still queued with it. What the acceptor lent over it
 * stays here and keeps serving (the epoch tells those sessions apart: they are never
 * returned to a later connection). `why` NULL: a deliberate close, nothing to log.
 */
static void
ngx_http_sluice_disconnect(ngx_http_sluice_upstream_t *up, const char *why)
{
    ngx_http_sluice_msg_t  *m;

    if (why) {
        ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                      "sluice: closing the connection to the acceptor at \"%V\" "
                      "(upstream \"%V\"): %s", &up->path, &up->name, why);
    }

    while (up->out_count) {
        m = &up->out[up->out_head];
        if (m->fd != -1) {
            ngx_close_socket(m->fd);
        }
        up->out_head = (up->out_head + 1) % NGX_HTTP_SLUICE_OUT_MAX;
        up->out_count--;
    }

    if (up->flush.timer_set) {
        ngx_del_timer(&up->flush);
    }

    if (up->linger.timer_set) {
        ngx_del_timer(&up->linger);
    }

    if (up->handoff) {
        ngx_close_connection(up->handoff);
        up->handoff = NULL;
    }

    up->hello = 0;
    up->empty = 0;  /* unknown again: requests wait, as with no SLICE at all */
    up->credit = 0;
    up->recall = 0;
    up->epoch++;

    ngx_http_sluice_schedule(up);
}


/* Reads every datagram there is; each one is handled before the next is read. */
static void
ngx_http_sluice_read_handler(ngx_event_t *ev)
{
    u_char                      buf[NGX_HTTP_SLUICE_MAX_LINE + 1];
    ssize_t                     n;
    ngx_err_t                   err;
    ngx_uint_t                  i, nfds;
    ngx_socket_t                fds[NGX_HTTP_SLUICE_MAX_FDS];
    struct iovec                iov;
    struct msghdr               msg;
    struct cmsghdr             *cmsg;
    const char                 *error;
    ngx_connection_t           *c = ev->data;
    ngx_http_sluice_upstream_t *up = c->data;

    union {
        struct cmsghdr  cm;
        char            space[CMSG_SPACE(sizeof(int) * NGX_HTTP_SLUICE_MAX_FDS)];
    } control;

    if (c->close) {
        /* The worker exits: stay connected while there is something left to do. */
        c->close = 0;
        c->idle = 0;
        up->linger.handler = ngx_http_sluice_linger_handler;
        up->linger.data = up;
        up->linger.log = ngx_cycle->log;
        up->linger_until = ngx_current_msec + NGX_HTTP_SLUICE_LINGER;
        ngx_add_timer(&up->linger, 10);
    }

    for ( ;; ) {
        ngx_memzero(&msg, sizeof(struct msghdr));
        iov.iov_base = buf;
        iov.iov_len = sizeof(buf);  /* one more than allowed: MSG_TRUNC or len tells */
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof(control.space);

        n = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

        if (n == -1) {
            err = ngx_socket_errno;
            if (err == NGX_EAGAIN) {
                ev->ready = 0;
                if (ngx_handle_read_event(ev, 0) != NGX_OK) {
                    ngx_http_sluice_disconnect(up, "cannot watch the socket");
                }
                return;
            }
            if (err == NGX_EINTR) {
                continue;
            }
            if (err == NGX_ECONNRESET && !up->hello) {
                ngx_http_sluice_refused(up);
                ngx_http_sluice_disconnect(up, "the acceptor closed the connection");
                return;
            }
            ngx_log_error(NGX_LOG_ERR, c->log, err, "sluice: recvmsg() failed");
            ngx_http_sluice_disconnect(up, "recvmsg() failed");
            return;
        }

        /* Collect every fd first, so that each one is closed on any error below. */
        nfds = 0;
        for (cmsg = CMSG_FIRSTHDR(&msg); cmsg; cmsg = CMSG_NXTHDR(&msg, cmsg)) {
            if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) {
                continue;
            }
            for (i = 0; CMSG_LEN((i + 1) * sizeof(int)) <= cmsg->cmsg_len; i++) {
                if (nfds < NGX_HTTP_SLUICE_MAX_FDS) {
                    ngx_memcpy(&fds[nfds++], CMSG_DATA(cmsg) + i * sizeof(int),
                               sizeof(int));
                }
            }
        }

        if (n == 0 && nfds == 0 && !up->hello) {
            ngx_http_sluice_refused(up);
            error = "the acceptor closed the connection";

        } else if (n == 0) {
            error = nfds ? "an empty message" : "the acceptor closed the connection";

        } else if (msg.msg_flags & MSG_CTRUNC) {
            error = "truncated ancillary data (too many fds)";

        } else if ((msg.msg_flags & MSG_TRUNC) || n > NGX_HTTP_SLUICE_MAX_LINE) {
            error = "a message longer than 512 bytes";

        } else {
            error = ngx_http_sluice_handle(up, buf, n, fds, nfds);
            if (error == NULL) {
                nfds = 0;  /* handed on */
            }
        }

        if (error) {
            for (i = 0; i < nfds; i++) {
                ngx_close_socket(fds[i]);
            }
            if (n != 0) {
                up->stats.protocol_errors++;
            }
            if (up->handoff == c) {
                ngx_http_sluice_disconnect(up, error);
            }
            return;
        }

        if (up->handoff != c) {
            return;  /* a send failed while handling it: already disconnected */
        }
    }
}


/* An acceptor refuses a peer whose uid it does not allow right after accepting it: the
 * connection ends (or is reset, our HELLO unread) before its HELLO. */
static void
ngx_http_sluice_refused(ngx_http_sluice_upstream_t *up)
{
    ngx_log_error(NGX_LOG_WARN, ngx_cycle->log, 0,
                  "sluice: the acceptor at \"%V\" closed the connection before its HELLO "
                  "(upstream \"%V\"), as it does to peers whose uid it does not allow: "
                  "if its log says \"handoff connection refused\", list uid %d in its "
                  "[handoff] allowed_uids", &up->path, &up->name, (int) geteuid());
}


/*
 * One message. Returns NULL when it was handled (its fd, if any, is now owned elsewhere),
 * or why it is a protocol error (the caller closes its fds and the connection).
 */
static const char *
ngx_http_sluice_handle(ngx_http_sluice_upstream_t *up, u_char *line, size_t len,
    ngx_socket_t *fds, ngx_uint_t nfds)
{
    uint64_t                 id, n;
    const char              *error;
    ngx_str_t               *w;
    ngx_http_sluice_words_t  words;

    error = ngx_http_sluice_split(line, len, &words);
    if (error) {
        return error;
    }

    w = words.word;

    if (!up->hello) {
        if (words.n == 3 && nfds == 0
            && ngx_strncmp(w[0].data, "HELLO", 5) == 0 && w[0].len == 5
            && w[1].len == 1 && w[1].data[0] == '1'
            && w[2].len == 8 && ngx_strncmp(w[2].data, "acceptor", 8) == 0)
        {
            up->hello = 1;
            up->backoff = NGX_HTTP_SLUICE_BACKOFF_MIN;
            up->stats.connects++;
            ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                          "sluice: connected to the acceptor at \"%V\" (upstream \"%V\")",
                          &up->path, &up->name);
            up->events->connected(up);
            return NULL;
        }
        return "expected \"HELLO 1 acceptor\" first";
    }

    if (w[0].len == 7 && ngx_strncmp(w[0].data, "SESSION", 7) == 0) {
        if (words.n != 5) {
            return "SESSION needs an id, a cluster, a slice and an instance";
        }
        if (nfds != 1) {
            return "SESSION without exactly one fd";
        }
        if (ngx_http_sluice_number(&w[1], (uint64_t) -1, &id) != NGX_OK) {
            return "SESSION with a malformed id";
        }
        if (ngx_http_sluice_is_ours(up, &w[2], &w[3]) != NGX_OK) {
            return "SESSION for a cluster or slice we did not ask for";
        }
        if (up->credit == 0) {
            return "SESSION beyond the credit we gave";
        }
        up->credit--;
        up->events->session(up, id, w[4].data, w[4].len, fds[0]);
        return NULL;
    }

    if (nfds != 0) {
        return "an fd with a message that carries none";
    }

    if (w[0].len == 6 && ngx_strncmp(w[0].data, "RECALL", 6) == 0) {
        if (words.n != 4) {
            return "RECALL needs a cluster, a slice and a count";
        }
        if (ngx_http_sluice_number(&w[3], 0xffffffff, &n) != NGX_OK || n == 0) {
            return "RECALL with a malformed count";
        }
        if (ngx_http_sluice_is_ours(up, &w[1], &w[2]) != NGX_OK) {
            return "RECALL for a cluster or slice we did not ask for";
        }
        up->events->recall(up, (ngx_uint_t) n);
        return NULL;
    }

    if (w[0].len == 5 && ngx_strncmp(w[0].data, "SLICE", 5) == 0) {
        if (words.n != 4) {
            return "SLICE needs a cluster, a slice and a state";
        }
        if (ngx_http_sluice_is_ours(up, &w[1], &w[2]) != NGX_OK) {
            return "SLICE for a cluster or slice we did not ask for";
        }
        if (w[3].len == 5 && ngx_strncmp(w[3].data, "empty", 5) == 0) {
            up->events->slice(up, 1);
            return NULL;
        }
        if (w[3].len == 10 && ngx_strncmp(w[3].data, "registered", 10) == 0) {
            up->events->slice(up, 0);
            return NULL;
        }
        return "SLICE with a state other than empty or registered";
    }

    if (w[0].len == 5 && ngx_strncmp(w[0].data, "DRAIN", 5) == 0) {
        if (words.n != 2) {
            return "DRAIN needs exactly an instance";
        }
        ngx_log_error(NGX_LOG_INFO, ngx_cycle->log, 0,
                      "sluice: instance \"%V\" drains (upstream \"%V\")",
                      &w[1], &up->name);
        up->events->drain(up, w[1].data, w[1].len);
        return NULL;
    }

    return "an unknown or misplaced message";
}


/* Splits a line into words: visible ASCII separated by single spaces, one optional
 * trailing newline, names at most 128 bytes. */
static const char *
ngx_http_sluice_split(u_char *line, size_t len, ngx_http_sluice_words_t *w)
{
    u_char  *p, *end, *start;

    if (len && line[len - 1] == '\n') {
        len--;
    }

    if (len == 0) {
        return "an empty message";
    }

    w->n = 0;
    end = line + len;
    start = line;

    for (p = line; p <= end; p++) {
        if (p < end && *p != ' ') {
            if (*p < 0x21 || *p > 0x7e) {
                return "a byte that is not visible ASCII";
            }
            continue;
        }
        if (p == start) {
            return "an empty word (leading, trailing or double space)";
        }
        if (p - start > NGX_HTTP_SLUICE_MAX_NAME) {
            return "a word longer than 128 bytes";
        }
        if (w->n == NGX_HTTP_SLUICE_MAX_WORDS) {
            return "too many words";
        }
        w->word[w->n].data = start;
        w->word[w->n].len = p - start;
        w->n++;
        start = p + 1;
    }

    return NULL;
}


/* A canonical unsigned decimal: digits only, no sign, no leading zero, at most `max`. */
static ngx_int_t
ngx_http_sluice_number(ngx_str_t *word, uint64_t max, uint64_t *out)
{
    size_t    i;
    uint64_t  v = 0, d;

    if (word->len == 0 || word->len > 20 || (word->len > 1 && word->data[0] == '0')) {
        return NGX_ERROR;
    }

    for (i = 0; i < word->len; i++) {
        if (word->data[i] < '0' || word->data[i] > '9') {
            return NGX_ERROR;
        }
        d = word->data[i] - '0';
        if (v > (max - d) / 10) {
            return NGX_ERROR;
        }
        v = v * 10 + d;
    }

    *out = v;
    return NGX_OK;
}


static ngx_int_t
ngx_http_sluice_is_ours(ngx_http_sluice_upstream_t *up, ngx_str_t *cluster,
    ngx_str_t *slice)
{
    if (cluster->len == up->cluster.len && slice->len == up->slice.len
        && ngx_strncmp(cluster->data, up->cluster.data, cluster->len) == 0
        && ngx_strncmp(slice->data, up->slice.data, slice->len) == 0)
    {
        return NGX_OK;
    }

    return NGX_DECLINED;
}


/*
 * Sends one message, with a session's fd when `fd` is not -1 (the caller closes its own
 * copy afterwards, whatever happens). A full socket queues the message (with a duplicate
 * of the fd) until the socket is writable; a failure disconnects.
 */
ngx_int_t
ngx_http_sluice_send(ngx_http_sluice_upstream_t *up, u_char *line, size_t len,
    ngx_socket_t fd)
{
    ssize_t                 n;
    ngx_err_t               err;
    ngx_http_sluice_msg_t  *m;

    if (up->handoff == NULL) {
        return NGX_ERROR;
    }

    if (up->out_count == 0) {
        n = ngx_http_sluice_sendmsg(up->handoff->fd, line, len, fd);
        if (n == (ssize_t) len) {
            return NGX_OK;
        }
        err = ngx_socket_errno;
        if (n != -1 || err != NGX_EAGAIN) {
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, err, "sluice: sendmsg() failed");
            ngx_http_sluice_disconnect(up, "sendmsg() failed");
            return NGX_ERROR;
        }
    }

    if (up->out_count == NGX_HTTP_SLUICE_OUT_MAX) {
        ngx_http_sluice_disconnect(up, "the acceptor reads nothing; too many messages wait");
        return NGX_ERROR;
    }

    m = &up->out[(up->out_head + up->out_count) % NGX_HTTP_SLUICE_OUT_MAX];
    m->fd = -1;
    if (fd != -1) {
        m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (m->fd == -1) {
            ngx_log_error(NGX_LOG_ALERT, ngx_cycle->log, ngx_errno,
                          "sluice: dup() failed");
            return NGX_ERROR;
        }
    }
    ngx_memcpy(m->line, line, len);
    m->len = len;
    up->out_count++;

    up->handoff->write->ready = 0;
    if (ngx_handle_write_event(up->handoff->write, 0) != NGX_OK) {
        ngx_http_sluice_disconnect(up, "cannot watch the socket");
        return NGX_ERROR;
    }

    /* A retry in case the write event is missed; an exiting worker is kept alive (to
     * send what waits, for a bounded time) by the linger timer, not by this one. */
    if (!up->flush.timer_set) {
        up->flush.handler = ngx_http_sluice_flush_handler;
        up->flush.data = up;
        up->flush.log = ngx_cycle->log;
        up->flush.cancelable = 1;
        ngx_add_timer(&up->flush, 1000);
    }

    return NGX_OK;
}


static ssize_t
ngx_http_sluice_sendmsg(ngx_socket_t s, u_char *line, size_t len, ngx_socket_t fd)
{
    struct iovec    iov;
    struct msghdr   msg;
    struct cmsghdr *cmsg;

    union {
        struct cmsghdr  cm;
        char            space[CMSG_SPACE(sizeof(int))];
    } control;

    ngx_memzero(&msg, sizeof(struct msghdr));
    iov.iov_base = line;
    iov.iov_len = len;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;

    if (fd != -1) {
        ngx_memzero(&control, sizeof(control));
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof(control.space);
        cmsg = CMSG_FIRSTHDR(&msg);
        cmsg->cmsg_level = SOL_SOCKET;
        cmsg->cmsg_type = SCM_RIGHTS;
        cmsg->cmsg_len = CMSG_LEN(sizeof(int));
        ngx_memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
    }

    return sendmsg(s, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
}


/* Sends what waits, in order; NGX_AGAIN while the socket is still full. */
static ngx_int_t
ngx_http_sluice_flush(ngx_http_sluice_upstream_t *up)
{
    ssize_t                 n;
    ngx_err_t               err;
    ngx_http_sluice_msg_t  *m;

    while (up->out_count) {
        m = &up->out[up->out_head];
        n = ngx_http_sluice_sendmsg(up->handoff->fd, m->line, m->len, m->fd);
        if (n == -1) {
            err = ngx_socket_errno;
            if (err == NGX_EAGAIN) {
                return NGX_AGAIN;
            }
            ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, err, "sluice: sendmsg() failed");
            ngx_http_sluice_disconnect(up, "sendmsg() failed");
            return NGX_ERROR;
        }
        if (m->fd != -1) {
            ngx_close_socket(m->fd);
        }
        up->out_head = (up->out_head + 1) % NGX_HTTP_SLUICE_OUT_MAX;
        up->out_count--;
    }

    if (up->flush.timer_set) {
        ngx_del_timer(&up->flush);
    }

    return NGX_OK;
}


static void
ngx_http_sluice_write_handler(ngx_event_t *ev)
{
    ngx_connection_t            *c = ev->data;
    ngx_http_sluice_upstream_t  *up = c->data;

    if (ngx_http_sluice_flush(up) == NGX_AGAIN) {
        ev->ready = 0;
        if (ngx_handle_write_event(ev, 0) != NGX_OK) {
            ngx_http_sluice_disconnect(up, "cannot watch the socket");
        }
    }
}


/* A safety net for the write event. */
static void
ngx_http_sluice_flush_handler(ngx_event_t *ev)
{
    ngx_http_sluice_upstream_t  *up = ev->data;

    if (up->handoff == NULL) {
        return;
    }

    if (ngx_http_sluice_flush(up) == NGX_AGAIN) {
        ngx_add_timer(&up->flush, 1000);
    }
}


/*
 * An exiting worker keeps its connection (and itself: the timer is not cancelable) while
 * a request still holds or waits for a session -- those go back by RETURN after their
 * responses -- and while messages wait to be sent. Its open credit may still bring
 * sessions, which it returns at once; a session sent to a worker that has closed would be
 * lost and its service would re-dial. The credit cannot be withdrawn, so the worker waits
 * for it to be used up, for at most NGX_HTTP_SLUICE_LINGER ms once nothing else holds it.
 */
static void
ngx_http_sluice_linger_handler(ngx_event_t *ev)
{
    ngx_http_sluice_upstream_t  *up = ev->data;

    if (up->handoff == NULL) {
        return;
    }

    if (up->events->busy(up)) {
        up->linger_until = ngx_current_msec + NGX_HTTP_SLUICE_LINGER;
        ngx_add_timer(ev, 50);
        return;
    }

    /* Unsent messages and open credit wait, but not forever: an acceptor that reads
     * nothing must not keep an exiting worker alive. */
    if ((up->credit || up->out_count)
        && (ngx_msec_int_t) (up->linger_until - ngx_current_msec) > 0)
    {
        ngx_add_timer(ev, 50);
        return;
    }

    ngx_http_sluice_disconnect(up, NULL);
}
