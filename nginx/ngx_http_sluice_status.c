/*
 * sluice_status: the counts of the worker that took the connection, as JSON
 * (nginx/README.md shows them).
 */

#include "ngx_http_sluice.h"


ngx_int_t
ngx_http_sluice_status_handler(ngx_http_request_t *r)
{
    size_t                         len;
    ngx_int_t                      rc;
    ngx_buf_t                     *b;
    ngx_uint_t                     i;
    ngx_chain_t                    out;
    ngx_http_sluice_upstream_t    *up, **ups;
    ngx_http_sluice_main_conf_t   *smcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    smcf = ngx_http_get_module_main_conf(r, ngx_http_sluice_module);
    ups = smcf->upstreams.elts;

    len = sizeof("{\"pid\":,\"upstreams\":[]}\n") + NGX_INT_T_LEN;
    for (i = 0; i < smcf->upstreams.nelts; i++) {
        /* Names may hold quotes or backslashes: all three are escaped below. */
        len += 512 + 20 * NGX_INT_T_LEN
               + ups[i]->name.len
               + ngx_escape_json(NULL, ups[i]->name.data, ups[i]->name.len)
               + ups[i]->cluster.len
               + ngx_escape_json(NULL, ups[i]->cluster.data, ups[i]->cluster.len)
               + ups[i]->slice.len
               + ngx_escape_json(NULL, ups[i]->slice.data, ups[i]->slice.len);
    }

    b = ngx_create_temp_buf(r->pool, len);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->last = ngx_sprintf(b->last, "{\"pid\":%P,\"upstreams\":[", ngx_pid);

    for (i = 0; i < smcf->upstreams.nelts; i++) {
        up = ups[i];
        b->last = ngx_sprintf(b->last, "%s{\"name\":\"", i ? "," : "");
        b->last = (u_char *) ngx_escape_json(b->last, up->name.data, up->name.len);
        b->last = ngx_cpymem(b->last, "\",\"cluster\":\"", sizeof("\",\"cluster\":\"") - 1);
        b->last = (u_char *) ngx_escape_json(b->last, up->cluster.data, up->cluster.len);
        b->last = ngx_cpymem(b->last, "\",\"slice\":\"", sizeof("\",\"slice\":\"") - 1);
        b->last = (u_char *) ngx_escape_json(b->last, up->slice.data, up->slice.len);
        b->last = ngx_sprintf(b->last,
            "\",\"connected\":%s,\"registered\":%s,"
            "\"idle\":%ui,\"reserved\":%ui,\"leased\":%ui,\"queued\":%ui,"
            "\"credit\":%ui,\"recall\":%ui,"
            "\"received\":%ui,\"returned\":%ui,\"gone\":%ui,\"served\":%ui,"
            "\"waited\":%ui,\"rejected\":%ui,\"connects\":%ui,"
            "\"protocol_errors\":%ui,\"recalled\":%ui,\"drains\":%ui}",
            up->hello ? "true" : "false", up->empty ? "false" : "true",
            up->n_idle, up->n_reserved, up->n_leased, up->n_waiting,
            up->credit, up->recall,
            up->stats.received, up->stats.returned, up->stats.gone,
            up->stats.served, up->stats.queued, up->stats.rejected,
            up->stats.connects, up->stats.protocol_errors, up->stats.recalls,
            up->stats.drains);
    }

    b->last = ngx_sprintf(b->last, "]}\n");
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = b->last - b->pos;
    ngx_str_set(&r->headers_out.content_type, "application/json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}
