/*
 * ngx_http_sluice_module: proxy_pass to services that dial in to a Sluice acceptor.
 *
 *   upstream api {
 *       sluice_sessions unix:/run/sluice/handoff.sock cluster=api slice=default
 *                       idle=8 queue=1024 queue_timeout=2s;
 *   }
 *   location / {
 *       sluice_pass http://api;          # proxy_pass, with the admission queue
 *   }
 *
 * This file: the module, its directives and the worker's life cycle. What a request goes
 * through is ngx_http_sluice_balancer.c.
 */

#include "ngx_http_sluice.h"


/* sluice_pass is the proxy module's own proxy_pass, called through its directive table. */
extern ngx_module_t  ngx_http_proxy_module;


static void *ngx_http_sluice_create_main_conf(ngx_conf_t *cf);
static void *ngx_http_sluice_create_srv_conf(ngx_conf_t *cf);
static void *ngx_http_sluice_create_loc_conf(ngx_conf_t *cf);
static char *ngx_http_sluice_merge_loc_conf(ngx_conf_t *cf, void *parent,
    void *child);
static char *ngx_http_sluice_sessions(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static char *ngx_http_sluice_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_http_sluice_resolve_passes(ngx_conf_t *cf);
static char *ngx_http_sluice_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
static ngx_int_t ngx_http_sluice_postconfiguration(ngx_conf_t *cf);
static ngx_int_t ngx_http_sluice_init_process(ngx_cycle_t *cycle);
static void ngx_http_sluice_exit_process(ngx_cycle_t *cycle);

static ngx_int_t ngx_http_sluice_init_upstream(ngx_conf_t *cf,
    ngx_http_upstream_srv_conf_t *us);


static ngx_command_t  ngx_http_sluice_commands[] = {

    { ngx_string("sluice_sessions"),
      NGX_HTTP_UPS_CONF|NGX_CONF_1MORE,
      ngx_http_sluice_sessions,
      NGX_HTTP_SRV_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("sluice_pass"),
      NGX_HTTP_LOC_CONF|NGX_HTTP_LIF_CONF|NGX_HTTP_LMT_CONF|NGX_CONF_TAKE1,
      ngx_http_sluice_pass,
      NGX_HTTP_LOC_CONF_OFFSET,
      0,
      NULL },

    { ngx_string("sluice_status"),
      NGX_HTTP_LOC_CONF|NGX_CONF_NOARGS,
      ngx_http_sluice_status,
      0,
      0,
      NULL },

      ngx_null_command
};


static ngx_http_module_t  ngx_http_sluice_module_ctx = {
    NULL,                                  /* preconfiguration */
    ngx_http_sluice_postconfiguration,     /* postconfiguration */

    ngx_http_sluice_create_main_conf,      /* create main configuration */
    NULL,                                  /* init main configuration */

    ngx_http_sluice_create_srv_conf,       /* create server configuration */
    NULL,                                  /* merge server configuration */

    ngx_http_sluice_create_loc_conf,       /* create location configuration */
    ngx_http_sluice_merge_loc_conf         /* merge location configuration */
};


ngx_module_t  ngx_http_sluice_module = {
    NGX_MODULE_V1,
    &ngx_http_sluice_module_ctx,           /* module context */
    ngx_http_sluice_commands,              /* module directives */
    NGX_HTTP_MODULE,                       /* module type */
    NULL,                                  /* init master */
    NULL,                                  /* init module */
    ngx_http_sluice_init_process,          /* init process */
    NULL,                                  /* init thread */
    NULL,                                  /* exit thread */
    ngx_http_sluice_exit_process,          /* exit process */
    NULL,                                  /* exit master */
    NGX_MODULE_V1_PADDING
};


/* ---- configuration ---------------------------------------------------------------- */


static void *
ngx_http_sluice_create_main_conf(ngx_conf_t *cf)
{
    ngx_http_sluice_main_conf_t  *smcf;

    smcf = ngx_pcalloc(cf->pool, sizeof(ngx_http_sluice_main_conf_t));
    if (smcf == NULL) {
        return NULL;
    }

    if (ngx_array_init(&smcf->upstreams, cf->pool, 4,
                       sizeof(ngx_http_sluice_upstream_t *))
        != NGX_OK
        || ngx_array_init(&smcf->passes, cf->pool, 4,
                          sizeof(ngx_http_sluice_pass_t *))
           != NGX_OK)
    {
        return NULL;
    }

    return smcf;
}


static void *
ngx_http_sluice_create_loc_conf(ngx_conf_t *cf)
{
    return ngx_pcalloc(cf->pool, sizeof(ngx_http_sluice_loc_conf_t));
}


/* As proxy_pass: an `if` or `limit_except` block inherits its location's, nothing else. */
static char *
ngx_http_sluice_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_http_sluice_loc_conf_t  *prev = parent;
    ngx_http_sluice_loc_conf_t  *conf = child;

    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (conf->pass == NULL && clcf->noname) {
        conf->pass = prev->pass;
    }

    return NGX_CONF_OK;
}


static void *
ngx_http_sluice_create_srv_conf(ngx_conf_t *cf)
{
    /* Created for every server{} and upstream{} block; only upstreams with
     * sluice_sessions fill it in (path.len != 0). */
    return ngx_pcalloc(cf->pool, sizeof(ngx_http_sluice_upstream_t));
}


/* A name as docs/handoff.md allows it: 1-128 bytes of visible ASCII, no spaces. */
static ngx_int_t
ngx_http_sluice_valid_name(ngx_str_t *s)
{
    size_t  i;

    if (s->len == 0 || s->len > NGX_HTTP_SLUICE_MAX_NAME) {
        return NGX_ERROR;
    }

    for (i = 0; i < s->len; i++) {
        if (s->data[i] < 0x21 || s->data[i] > 0x7e) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* sluice_sessions unix:PATH cluster=NAME [slice=NAME] [idle=N] [queue=N]
 *                 [queue_timeout=TIME] [no_sessions_wait=TIME]; */
static char *
ngx_http_sluice_sessions(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_sluice_upstream_t  *up = conf;

    ngx_int_t                      n;
    ngx_str_t                     *value, v;
    ngx_uint_t                     i;
    ngx_http_sluice_upstream_t   **slot;
    ngx_http_sluice_main_conf_t   *smcf;
    ngx_http_upstream_server_t    *server;
    ngx_http_upstream_srv_conf_t  *uscf;

    if (up->path.len) {
        return "is duplicate";
    }

    value = cf->args->elts;
    uscf = ngx_http_conf_get_module_srv_conf(cf, ngx_http_upstream_module);

    if (uscf->peer.init_upstream) {
        return "cannot be combined with another balancing method "
               "(hash, least_conn, keepalive, ...)";
    }

    if (value[1].len <= 5 || ngx_strncmp(value[1].data, "unix:", 5) != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "sluice_sessions: the handoff socket must be given as "
                           "\"unix:/absolute/path\", not \"%V\"", &value[1]);
        return NGX_CONF_ERROR;
    }

    up->path.data = value[1].data + 5;
    up->path.len = value[1].len - 5;

    if (up->path.data[0] != '/' || up->path.len >= sizeof(up->sockaddr.sun_path)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "sluice_sessions: \"%V\" must be an absolute path shorter "
                           "than %uz bytes", &up->path, sizeof(up->sockaddr.sun_path));
        return NGX_CONF_ERROR;
    }

    up->sockaddr.sun_family = AF_UNIX;
    ngx_memcpy(up->sockaddr.sun_path, up->path.data, up->path.len);

    ngx_str_set(&up->slice, "default");
    up->idle_target = 4;
    up->queue_max = 1024;
    up->queue_timeout = 2000;

    for (i = 2; i < cf->args->nelts; i++) {

        if (ngx_strncmp(value[i].data, "cluster=", 8) == 0) {
            up->cluster.data = value[i].data + 8;
            up->cluster.len = value[i].len - 8;
            if (ngx_http_sluice_valid_name(&up->cluster) != NGX_OK) {
                goto bad_name;
            }
            continue;
        }

        if (ngx_strncmp(value[i].data, "slice=", 6) == 0) {
            up->slice.data = value[i].data + 6;
            up->slice.len = value[i].len - 6;
            if (ngx_http_sluice_valid_name(&up->slice) != NGX_OK) {
                goto bad_name;
            }
            continue;
        }

        if (ngx_strncmp(value[i].data, "idle=", 5) == 0) {
            n = ngx_atoi(value[i].data + 5, value[i].len - 5);
            if (n < 1 || n > 65536) {
                goto bad_number;
            }
            up->idle_target = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "queue=", 6) == 0) {
            n = ngx_atoi(value[i].data + 6, value[i].len - 6);
            if (n == NGX_ERROR || n > 1048576) {
                goto bad_number;
            }
            up->queue_max = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "no_sessions_wait=", 17) == 0) {
            v.data = value[i].data + 17;
            v.len = value[i].len - 17;
            n = ngx_parse_time(&v, 0);
            if (n == NGX_ERROR) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "sluice_sessions: invalid no_sessions_wait \"%V\" "
                                   "(a time such as 0, 500ms or 2s)", &v);
                return NGX_CONF_ERROR;
            }
            up->no_sessions_wait = n;
            continue;
        }

        if (ngx_strncmp(value[i].data, "queue_timeout=", 14) == 0) {
            v.data = value[i].data + 14;
            v.len = value[i].len - 14;
            n = ngx_parse_time(&v, 0);
            if (n == NGX_ERROR || n == 0) {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "sluice_sessions: invalid queue_timeout \"%V\" "
                                   "(a time such as 500ms or 2s, more than 0)", &v);
                return NGX_CONF_ERROR;
            }
            up->queue_timeout = n;
            continue;
        }

        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "sluice_sessions: unknown parameter \"%V\" (expected "
                           "cluster=, slice=, idle=, queue=, queue_timeout= or "
                           "no_sessions_wait=)",
                           &value[i]);
        return NGX_CONF_ERROR;
    }

    if (up->cluster.len == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "sluice_sessions: cluster=NAME is required");
        return NGX_CONF_ERROR;
    }

    up->name = uscf->host;
    up->peer_name.len = sizeof("sluice:/") - 1 + up->cluster.len + up->slice.len;
    up->peer_name.data = ngx_pnalloc(cf->pool, up->peer_name.len);
    if (up->peer_name.data == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_sprintf(up->peer_name.data, "sluice:%V/%V", &up->cluster, &up->slice);

    /*
     * NGINX refuses an upstream block without servers ("no servers are inside upstream"):
     * one placeholder stands for the acceptor. It has no address and is never used;
     * init_upstream refuses a block with real "server" lines as well.
     */
    if (uscf->servers == NULL) {
        uscf->servers = ngx_array_create(cf->pool, 1, sizeof(ngx_http_upstream_server_t));
        if (uscf->servers == NULL) {
            return NGX_CONF_ERROR;
        }
    }

    server = ngx_array_push(uscf->servers);
    if (server == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_memzero(server, sizeof(ngx_http_upstream_server_t));
    server->name = up->peer_name;

    uscf->peer.init_upstream = ngx_http_sluice_init_upstream;

    smcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_sluice_module);
    slot = ngx_array_push(&smcf->upstreams);
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }
    *slot = up;

    return NGX_CONF_OK;

bad_name:
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "sluice_sessions: invalid \"%V\" (a name is 1-128 bytes of "
                       "visible ASCII)", &value[i]);
    return NGX_CONF_ERROR;

bad_number:
    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "sluice_sessions: invalid \"%V\" (idle is 1-65536, "
                       "queue 0-1048576)", &value[i]);
    return NGX_CONF_ERROR;
}


/*
 * The upstream's name in sluice_pass's URL: "http://NAME" or "http://NAME/URI", without
 * variables or a port (NGX_ERROR otherwise).
 */
static ngx_int_t
ngx_http_sluice_pass_name(ngx_str_t *url, ngx_str_t *name)
{
    u_char  *p, *end;

    if (url->len <= 7 || ngx_strncasecmp(url->data, (u_char *) "http://", 7) != 0
        || ngx_strlchr(url->data, url->data + url->len, '$'))
    {
        return NGX_ERROR;
    }

    end = url->data + url->len;
    p = ngx_strlchr(url->data + 7, end, '/');

    name->data = url->data + 7;
    name->len = (p ? p : end) - name->data;

    if (name->len == 0 || ngx_strlchr(name->data, name->data + name->len, ':')) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/* proxy_pass's own directive handler, from the proxy module's directive table. */
static ngx_command_t *
ngx_http_sluice_proxy_pass(void)
{
    ngx_command_t  *cmd;

    for (cmd = ngx_http_proxy_module.commands; cmd && cmd->name.len; cmd++) {
        if (cmd->name.len == sizeof("proxy_pass") - 1
            && ngx_strncmp(cmd->name.data, "proxy_pass", cmd->name.len) == 0)
        {
            return cmd;
        }
    }

    return NULL;
}


/*
 * sluice_pass http://NAME[/URI]; -- proxy_pass to a sluice_sessions upstream whose requests
 * wait for a session. It is proxy_pass itself (the proxy module's handler, given the proxy
 * module's own location configuration, so every proxy_* directive applies as usual), and it
 * records the upstream in this module's location configuration for the precontent phase:
 * NGINX offers no public way to read which upstream another module's proxy_pass names.
 */
static char *
ngx_http_sluice_pass(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_sluice_loc_conf_t  *slcf = conf;

    char                          *rv;
    ngx_str_t                     *value, name;
    ngx_command_t                 *proxy_pass;
    ngx_http_sluice_pass_t        *pass, **slot;
    ngx_http_sluice_main_conf_t   *smcf;

    if (slcf->pass) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_http_sluice_pass_name(&value[1], &name) != NGX_OK) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "sluice_pass: \"%V\" must be \"http://NAME\" or "
                           "\"http://NAME/URI\", NAME an upstream with sluice_sessions "
                           "(no variables, no port; a session carries plain HTTP)",
                           &value[1]);
        return NGX_CONF_ERROR;
    }

    proxy_pass = ngx_http_sluice_proxy_pass();
    if (proxy_pass == NULL) {
        return "needs ngx_http_proxy_module";
    }

    rv = proxy_pass->set(cf, proxy_pass,
                         ngx_http_conf_get_module_loc_conf(cf, ngx_http_proxy_module));
    if (rv != NGX_CONF_OK) {
        return rv;
    }

    pass = ngx_pcalloc(cf->pool, sizeof(ngx_http_sluice_pass_t));
    smcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_sluice_module);
    slot = pass ? ngx_array_push(&smcf->passes) : NULL;
    if (slot == NULL) {
        return NGX_CONF_ERROR;
    }

    pass->name = name;
    pass->file = cf->conf_file->file.name.data;
    pass->line = cf->conf_file->line;
    *slot = pass;
    slcf->pass = pass;

    return NGX_CONF_OK;
}


/* Every sluice_pass names an upstream with sluice_sessions (defined anywhere in http{}). */
static ngx_int_t
ngx_http_sluice_resolve_passes(ngx_conf_t *cf)
{
    ngx_uint_t                    i, j;
    ngx_http_sluice_pass_t      **passes;
    ngx_http_sluice_upstream_t  **ups;
    ngx_http_sluice_main_conf_t  *smcf;

    smcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_sluice_module);
    passes = smcf->passes.elts;
    ups = smcf->upstreams.elts;

    for (i = 0; i < smcf->passes.nelts; i++) {
        for (j = 0; j < smcf->upstreams.nelts; j++) {
            if (ups[j]->name.len == passes[i]->name.len
                && ngx_strncasecmp(ups[j]->name.data, passes[i]->name.data,
                                   passes[i]->name.len) == 0)
            {
                passes[i]->up = ups[j];
            }
        }

        if (passes[i]->up == NULL) {
            ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                          "sluice_pass in %s:%ui: upstream \"%V\" has no "
                          "sluice_sessions (use proxy_pass for other upstreams)",
                          passes[i]->file, passes[i]->line, &passes[i]->name);
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


static char *
ngx_http_sluice_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    clcf->handler = ngx_http_sluice_status_handler;

    return NGX_CONF_OK;
}


static ngx_int_t
ngx_http_sluice_postconfiguration(ngx_conf_t *cf)
{
    ngx_http_handler_pt        *h;
    ngx_http_core_main_conf_t  *cmcf;

    if (ngx_http_sluice_resolve_passes(cf) != NGX_OK) {
        return NGX_ERROR;
    }

    cmcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_core_module);

    h = ngx_array_push(&cmcf->phases[NGX_HTTP_PRECONTENT_PHASE].handlers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    *h = ngx_http_sluice_precontent;

    return NGX_OK;
}


static ngx_int_t
ngx_http_sluice_init_upstream(ngx_conf_t *cf, ngx_http_upstream_srv_conf_t *us)
{
    if (us->servers == NULL || us->servers->nelts != 1) {
        ngx_log_error(NGX_LOG_EMERG, cf->log, 0,
                      "upstream \"%V\" in %s:%ui has both sluice_sessions and "
                      "\"server\" lines; sessions come from the acceptor only",
                      &us->host, us->file_name, us->line);
        return NGX_ERROR;
    }

    us->peer.init = ngx_http_sluice_init_peer;

    return NGX_OK;
}


/* ---- worker lifecycle --------------------------------------------------------------- */


static ngx_int_t
ngx_http_sluice_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                    i;
    ngx_http_sluice_upstream_t   *up, **ups;
    ngx_http_sluice_main_conf_t  *smcf;

    if (ngx_process != NGX_PROCESS_WORKER && ngx_process != NGX_PROCESS_SINGLE) {
        return NGX_OK;
    }

    smcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_sluice_module);
    if (smcf == NULL) {
        return NGX_OK;
    }

    ups = smcf->upstreams.elts;

    for (i = 0; i < smcf->upstreams.nelts; i++) {
        up = ups[i];

        ngx_queue_init(&up->turns);
        ngx_queue_init(&up->instances);
        ngx_queue_init(&up->busy);
        ngx_queue_init(&up->waiters);
        up->events = &ngx_http_sluice_pool_events;
        up->backoff = NGX_HTTP_SLUICE_BACKOFF_MIN;

        up->out = ngx_pcalloc(cycle->pool,
                              sizeof(ngx_http_sluice_msg_t) * NGX_HTTP_SLUICE_OUT_MAX);
        if (up->out == NULL) {
            return NGX_ERROR;
        }

        ngx_http_sluice_handoff_start(up);
    }

    return NGX_OK;
}


static void
ngx_http_sluice_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                    i;
    ngx_http_sluice_upstream_t  **ups;
    ngx_http_sluice_main_conf_t  *smcf;

    smcf = ngx_http_cycle_get_module_main_conf(cycle, ngx_http_sluice_module);
    if (smcf == NULL) {
        return;
    }

    ups = smcf->upstreams.elts;

    for (i = 0; i < smcf->upstreams.nelts; i++) {
        if (ups[i]->out == NULL) {
            continue;
        }

        /*
         * A SESSION may be on its way (our credit was still open): read what is there and
         * return it (release() returns everything while the worker exits), so that as few
         * sessions as possible close with this worker and make their services re-dial.
         */
        if (ups[i]->handoff && ups[i]->hello) {
            ups[i]->handoff->read->ready = 1;
            ups[i]->handoff->read->handler(ups[i]->handoff->read);
        }

        ngx_http_sluice_close_all(ups[i]);
        ngx_http_sluice_handoff_stop(ups[i]);
    }
}
