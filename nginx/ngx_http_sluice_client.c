/*
 * Sluice-Client-Addr (protocol/README.md in the Sluice repository): every request sent over a
 * session carries exactly one, the client's address as NGINX sees it ($remote_addr and
 * $remote_port, so a trusted set_real_ip_from applies), and never a copy the client sent.
 * Services trust it as they would trust their own socket's peer address.
 *
 * The field is put in the request's own headers, which proxy_pass forwards: the header list
 * is rebuilt without the client's copies and with ours at the end. The old list stays in the
 * request's pool, so the pointers other modules keep into it (headers_in.host, ...) stay
 * valid; a subrequest, whose list is its parent's, gets a list of its own.
 */

#include "ngx_http_sluice.h"


#define NGX_HTTP_SLUICE_CLIENT_ADDR  "sluice-client-addr"
/* "[" 39 "]:" 5 */
#define NGX_HTTP_SLUICE_ADDR_LEN     (NGX_INET6_ADDRSTRLEN + 8)


static size_t ngx_http_sluice_format_addr(struct sockaddr *sa, u_char *buf);
static u_char *ngx_http_sluice_format_v6(u_char *p, u_char *addr);
static ngx_int_t ngx_http_sluice_is_client_addr(ngx_table_elt_t *h);


/* Replaces every Sluice-Client-Addr of the request with the client's address. */
ngx_int_t
ngx_http_sluice_stamp_client(ngx_http_request_t *r)
{
    size_t            len;
    u_char            addr[NGX_HTTP_SLUICE_ADDR_LEN];
    ngx_uint_t        i, n;
    ngx_list_t        old, *headers;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h, *copy;

    old = r->headers_in.headers;
    headers = &r->headers_in.headers;

    n = 1;
    for (part = &old.part; part; part = part->next) {
        n += part->nelts;
    }

    if (ngx_list_init(headers, r->pool, n, sizeof(ngx_table_elt_t)) != NGX_OK) {
        return NGX_ERROR;
    }

    for (part = &old.part; part; part = part->next) {
        h = part->elts;
        for (i = 0; i < part->nelts; i++) {
            if (ngx_http_sluice_is_client_addr(&h[i])) {
                continue;
            }
            copy = ngx_list_push(headers);
            if (copy == NULL) {
                return NGX_ERROR;
            }
            *copy = h[i];
        }
    }

    len = ngx_http_sluice_format_addr(r->connection->sockaddr, addr);

    if (len) {
        h = ngx_list_push(headers);
        if (h == NULL) {
            return NGX_ERROR;
        }
        ngx_memzero(h, sizeof(ngx_table_elt_t));
        ngx_str_set(&h->key, "Sluice-Client-Addr");
        h->lowcase_key = (u_char *) NGX_HTTP_SLUICE_CLIENT_ADDR;
        h->hash = ngx_hash_key(h->lowcase_key, h->key.len);
        h->value.data = ngx_pnalloc(r->pool, len);
        if (h->value.data == NULL) {
            return NGX_ERROR;
        }
        ngx_memcpy(h->value.data, addr, len);
        h->value.len = len;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_sluice_is_client_addr(ngx_table_elt_t *h)
{
    return h->key.len == sizeof(NGX_HTTP_SLUICE_CLIENT_ADDR) - 1
           && ngx_strncasecmp(h->key.data, (u_char *) NGX_HTTP_SLUICE_CLIENT_ADDR,
                              h->key.len) == 0;
}


/* `ip:port`, `[ip]:port` for IPv6 (an IPv4-mapped one as the IPv4 address it is); 0 for a
 * client that has no IP address (a UNIX socket listener). */
static size_t
ngx_http_sluice_format_addr(struct sockaddr *sa, u_char *buf)
{
    u_char               *p;
    struct sockaddr_in   *sin;
#if (NGX_HAVE_INET6)
    u_char               *v6;
    struct sockaddr_in6  *sin6;
#endif

    switch (sa->sa_family) {

    case AF_INET:
        sin = (struct sockaddr_in *) sa;
        p = buf + ngx_inet_ntop(AF_INET, &sin->sin_addr, buf, NGX_INET_ADDRSTRLEN);
        return ngx_sprintf(p, ":%d", (int) ntohs(sin->sin_port)) - buf;

#if (NGX_HAVE_INET6)
    case AF_INET6:
        sin6 = (struct sockaddr_in6 *) sa;
        v6 = sin6->sin6_addr.s6_addr;

        if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr)) {
            p = buf + ngx_inet_ntop(AF_INET, &v6[12], buf, NGX_INET_ADDRSTRLEN);

        } else {
            *buf = '[';
            p = ngx_http_sluice_format_v6(buf + 1, v6);
            *p++ = ']';
        }

        return ngx_sprintf(p, ":%d", (int) ntohs(sin6->sin6_port)) - buf;
#endif

    default:
        return 0;
    }
}


/*
 * RFC 5952, as the proxy writes it (Rust's Ipv6Addr): lowercase hex groups without leading
 * zeros, the first longest run of two or more zero groups written "::". (NGINX's own
 * ngx_inet6_ntop writes some addresses with an embedded IPv4 part instead.)
 */
static u_char *
ngx_http_sluice_format_v6(u_char *p, u_char *addr)
{
    ngx_uint_t  i, group[8], start, len, best, best_len;

    best = 8;
    best_len = 1;
    len = 0;
    start = 0;

    for (i = 0; i < 8; i++) {
        group[i] = (addr[2 * i] << 8) | addr[2 * i + 1];
        if (group[i]) {
            len = 0;
            continue;
        }
        if (len++ == 0) {
            start = i;
        }
        if (len > best_len) {
            best = start;
            best_len = len;
        }
    }

    for (i = 0; i < 8; i++) {
        if (i == best) {
            *p++ = ':';
            *p++ = ':';
            i += best_len - 1;
            continue;
        }
        if (i && i != best + best_len) {
            *p++ = ':';
        }
        p = ngx_sprintf(p, "%xi", group[i]);
    }

    return p;
}
