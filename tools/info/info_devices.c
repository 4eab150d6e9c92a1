/* agoq-info's default view: load the plugin as NCCL does and show what NCCL will see. */
#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agoq_info.h"
#include "agoq_loader.h"
#include "net/agoq_net_config.h"

/* Newest profiler/tuner ABI version looked for (ncclProfiler_v1.., ncclTunerPlugin_v1..). */
#define AGOQ_INFO_MAX_AUX_VERSION 8

typedef struct {
  const char* path;
  char resolved[PATH_MAX];
  char open_error[1024];
  int net_versions[AGOQ_LOADER_NUM_VERSIONS];
  int n_net_versions;
  int collnet_versions[AGOQ_LOADER_NUM_VERSIONS];
  int n_collnet_versions;
  int profiler_versions[AGOQ_INFO_MAX_AUX_VERSION];
  int n_profiler_versions;
  int tuner_versions[AGOQ_INFO_MAX_AUX_VERSION];
  int n_tuner_versions;

  agoq_net_view net;
  char net_error[128];  /* first failing call, empty when all succeeded */
  int ndev;
  agoq_view_props* props;

  /* The same facts from the plugin's own init code in this process: address, carrier,
   * speed source, sockets and threads (NCCL's properties carry none of them). */
  bool net_resolved;
  agoq_info_net net_cfg;

  bool has_collnet;
  agoq_collnet_view collnet;
  char collnet_error[128];
  int collnet_ndev;
} agoq_info_report;

/* The loaded plugin's summary of what is in effect, taken from its own init's log (the
 * lines tagged AGOQ_EFFECT_TAG), so the view shows what that library decided, not what this
 * tool's copy of the code would. */
#define AGOQ_INFO_EFFECT_MAX 8
static struct {
  char lines[AGOQ_INFO_EFFECT_MAX][640];
  int n;
} agoq_info_effect;

static void agoq_info_capture_effect(ncclDebugLogLevel level, const char* msg) {
  const char* tag = strstr(msg, AGOQ_EFFECT_TAG);
  if (tag != NULL && agoq_info_effect.n < AGOQ_INFO_EFFECT_MAX)
    snprintf(agoq_info_effect.lines[agoq_info_effect.n++], sizeof agoq_info_effect.lines[0], "%s%s",
             level == NCCL_LOG_WARN ? "WARN: " : "", tag + strlen(AGOQ_EFFECT_TAG));
}

/* The profiler and tuner tables NCCL also looks for in the net library (2.28.3+), newest
 * first. The library is already loaded; dlopen of the same path only takes a reference. */
static void agoq_info_aux_versions(agoq_info_report* rep) {
  void* h = dlopen(rep->path, RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) return;
  for (int v = AGOQ_INFO_MAX_AUX_VERSION; v >= 1; v--) {
    char name[64];
    snprintf(name, sizeof name, "ncclProfiler_v%d", v);
    if (dlsym(h, name) != NULL) rep->profiler_versions[rep->n_profiler_versions++] = v;
    snprintf(name, sizeof name, "ncclTunerPlugin_v%d", v);
    if (dlsym(h, name) != NULL) rep->tuner_versions[rep->n_tuner_versions++] = v;
  }
  dlclose(h);
}

static void agoq_info_call_failed(char* buf, size_t len, int version, const char* call,
                                  ncclResult_t r) {
  snprintf(buf, len, "v%d %s failed: %s", version, call, agoq_result_str(r));
}

/* init (commId 0, as for a first communicator), devices, getProperties of each, finalize:
 * the calls NCCL makes during topology detection. */
static void agoq_info_collect_net(agoq_netlib* lib, agoq_info_report* rep) {
  if (agoq_netlib_net_view(lib, rep->net_versions[0], &rep->net) != 0) {
    snprintf(rep->net_error, sizeof rep->net_error, "no view for v%d", rep->net_versions[0]);
    return;
  }
  void* ctx = NULL;
  ncclResult_t r = agoq_view_init(&rep->net, &ctx, 0, agoq_log_stderr);
  if (r != ncclSuccess) {
    agoq_info_call_failed(rep->net_error, sizeof rep->net_error, rep->net.version, "init", r);
    goto finalize; /* NCCL finalizes even after a failed init */
  }
  r = agoq_view_devices(&rep->net, &rep->ndev);
  if (r != ncclSuccess || rep->ndev < 0) {
    agoq_info_call_failed(rep->net_error, sizeof rep->net_error, rep->net.version, "devices", r);
    rep->ndev = 0;
    goto finalize;
  }
  if (rep->ndev > 0) {
    rep->props = calloc((size_t)rep->ndev, sizeof(*rep->props));
    if (rep->props == NULL) {
      snprintf(rep->net_error, sizeof rep->net_error, "out of memory for %d devices", rep->ndev);
      rep->ndev = 0;
      goto finalize;
    }
  }
  for (int d = 0; d < rep->ndev; d++) {
    r = agoq_view_get_properties(&rep->net, d, &rep->props[d]);
    if (r != ncclSuccess) {
      char call[48];
      snprintf(call, sizeof call, "getProperties(%d)", d);
      agoq_info_call_failed(rep->net_error, sizeof rep->net_error, rep->net.version, call, r);
      rep->ndev = d;
      break;
    }
  }
finalize:
  r = agoq_view_finalize(&rep->net, ctx);
  if (r != ncclSuccess && rep->net_error[0] == '\0')
    agoq_info_call_failed(rep->net_error, sizeof rep->net_error, rep->net.version, "finalize", r);
}

static void agoq_info_collect_collnet(agoq_netlib* lib, agoq_info_report* rep) {
  if (rep->n_collnet_versions == 0) return;
  if (agoq_netlib_collnet_view(lib, rep->collnet_versions[0], &rep->collnet) != 0) return;
  rep->has_collnet = true;
  void* ctx = NULL;
  ncclResult_t r = agoq_collnet_view_init(&rep->collnet, &ctx, 0, agoq_log_stderr);
  if (r != ncclSuccess) {
    agoq_info_call_failed(rep->collnet_error, sizeof rep->collnet_error, rep->collnet.version,
                          "init", r);
  } else if ((r = agoq_collnet_view_devices(&rep->collnet, &rep->collnet_ndev)) != ncclSuccess) {
    agoq_info_call_failed(rep->collnet_error, sizeof rep->collnet_error, rep->collnet.version,
                          "devices", r);
    rep->collnet_ndev = 0;
  }
  r = agoq_collnet_view_finalize(&rep->collnet, ctx);
  if (r != ncclSuccess && rep->collnet_error[0] == '\0')
    agoq_info_call_failed(rep->collnet_error, sizeof rep->collnet_error, rep->collnet.version,
                          "finalize", r);
}

/* "HOST|CUDA|DMABUF"; unknown bits in hex. */
static void agoq_info_ptr_support(int bits, char* buf, size_t len) {
  static const struct {
    int bit;
    const char* name;
  } flags[] = {{NCCL_PTR_HOST, "HOST"}, {NCCL_PTR_CUDA, "CUDA"}, {NCCL_PTR_DMABUF, "DMABUF"}};
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof flags / sizeof flags[0] && n < len; i++) {
    if (bits & flags[i].bit) {
      n += (size_t)snprintf(buf + n, len - n, "%s%s", n > 0 ? "|" : "", flags[i].name);
      bits &= ~flags[i].bit;
    }
  }
  if (bits != 0 && n < len)
    n += (size_t)snprintf(buf + n, len - n, "%s0x%x", n > 0 ? "|" : "", (unsigned)bits);
  if (n == 0) snprintf(buf, len, "none");
}

static const char* agoq_info_device_type(int type) {
  switch (type) {
    case NCCL_NET_DEVICE_HOST: return "HOST";
    case NCCL_NET_DEVICE_UNPACK: return "UNPACK";
    default: return "unknown";
  }
}

/* ---- Text -------------------------------------------------------------------------------- */

static void agoq_info_print_versions(FILE* out, const char* what, const int* v, int n) {
  fprintf(out, "%-20s", what);
  if (n == 0) fputs(" none", out);
  for (int i = 0; i < n; i++) fprintf(out, " v%d", v[i]);
  fputc('\n', out);
}

static void agoq_info_print_text(FILE* out, const agoq_info_report* rep) {
  fprintf(out, "agoq %s\n", AGOQ_VERSION_STRING);
  fprintf(out, "%-20s %s\n", "features:", AGOQ_FEATURES_STRING);
  fprintf(out, "%-20s %s\n", "plugin:", rep->path);
  agoq_info_print_versions(out, "net ABI:", rep->net_versions, rep->n_net_versions);
  agoq_info_print_versions(out, "collnet ABI:", rep->collnet_versions, rep->n_collnet_versions);
  agoq_info_print_versions(out, "profiler ABI:", rep->profiler_versions,
                           rep->n_profiler_versions);
  agoq_info_print_versions(out, "tuner ABI:", rep->tuner_versions, rep->n_tuner_versions);

  fputs("\nin effect (the plugin's init says):\n", out);
  if (agoq_info_effect.n == 0) fputs("  (nothing: init failed before deciding; see the WARN lines)\n", out);
  for (int i = 0; i < agoq_info_effect.n; i++) fprintf(out, "  %s\n", agoq_info_effect.lines[i]);

  fprintf(out, "\nnet devices through ncclNetPlugin_v%d \"%s\": %d\n", rep->net.version,
          rep->net.name != NULL ? rep->net.name : "", rep->ndev);
  if (rep->net_error[0] != '\0') fprintf(out, "  error: %s\n", rep->net_error);
  for (int d = 0; d < rep->ndev; d++) {
    const agoq_view_props* p = &rep->props[d];
    char ptr[64], p2p[32], coll[32];
    agoq_info_ptr_support(p->ptr_support, ptr, sizeof ptr);
    agoq_info_size_human((long long)p->max_p2p_bytes, p2p, sizeof p2p);
    agoq_info_size_human((long long)p->max_coll_bytes, coll, sizeof coll);
    /* A TCP interface has an address, a carrier and a speed source; a verbs port has none
     * of those here (agoq-info -c lists its state, GID and link layer). */
    const agoq_netif* nif = rep->net_resolved ? agoq_info_net_find(&rep->net_cfg, p->name) : NULL;
    fprintf(out, "  [%d] %s\n", d, p->name);
    if (nif != NULL) {
      char addr[INET6_ADDRSTRLEN + 8];
      const char *link, *src;
      agoq_info_netif_fields(nif, addr, sizeof addr, &link, &src);
      fprintf(out, "      address       %s\n", addr);
      fprintf(out, "      link          %s\n", link);
      fprintf(out, "      pciPath       %s\n", p->has_pci_path ? p->pci_path : "(virtual)");
      fprintf(out, "      speed         %d Mbps, %s\n", p->speed, src);
    } else {
      fprintf(out, "      pciPath       %s\n", p->has_pci_path ? p->pci_path : "(virtual)");
      fprintf(out, "      speed         %d Mbps, as the verbs port reports it (agoq-info -c: the port's state)\n",
              p->speed);
    }
    fprintf(out, "      ptrSupport    %s\n", ptr);
    fprintf(out, "      maxRecvs      %d\n", p->max_recvs);
    fprintf(out, "      maxComms      %d\n", p->max_comms);
    fprintf(out, "      maxP2pBytes   %zu (%s)\n", p->max_p2p_bytes, p2p);
    fprintf(out, "      maxCollBytes  %zu (%s)\n", p->max_coll_bytes, coll);
    fprintf(out, "      guid          0x%016" PRIx64 "\n", p->guid);
    fprintf(out, "      port          %d\n", p->port);
    fprintf(out, "      latency       %g us\n", (double)p->latency);
    fprintf(out, "      regIsGlobal   %d, forceFlush %d, device type %s (version %d)\n",
            p->reg_is_global, p->force_flush, agoq_info_device_type(p->net_device_type),
            p->net_device_version);
    fprintf(out, "      vdevs         %d, maxMultiRequestSize %d\n", p->vdev_count,
            p->max_multi_request_size);
  }

  /* Sockets and progress threads exist only where TCP carries the data. */
  bool tcp_data = false;
  for (int d = 0; d < rep->ndev && rep->net_resolved; d++)
    if (agoq_info_net_find(&rep->net_cfg, rep->props[d].name) != NULL) tcp_data = true;
  if (tcp_data) {
    fputc('\n', out);
    agoq_info_net_print_counts(out, &rep->net_cfg);
  }

  if (!rep->has_collnet) {
    fputs("\ncollnet devices: none (no ncclCollNetPlugin exported)\n", out);
  } else {
    fprintf(out, "\ncollnet devices through ncclCollNetPlugin_v%d \"%s\": %d\n",
            rep->collnet.version, rep->collnet.name != NULL ? rep->collnet.name : "",
            rep->collnet_ndev);
    if (rep->collnet_error[0] != '\0') fprintf(out, "  error: %s\n", rep->collnet_error);
  }
}

/* ---- JSON -------------------------------------------------------------------------------- */

static void agoq_info_json_string(FILE* out, const char* s) {
  fputc('"', out);
  for (const unsigned char* p = (const unsigned char*)(s != NULL ? s : ""); *p != '\0'; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(out, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(out, "\\u%04x", *p);
    else
      fputc(*p, out);
  }
  fputc('"', out);
}

static void agoq_info_json_versions(FILE* out, const int* v, int n) {
  fputc('[', out);
  for (int i = 0; i < n; i++) fprintf(out, "%s%d", i > 0 ? ", " : "", v[i]);
  fputc(']', out);
}

static void agoq_info_print_json(FILE* out, const agoq_info_report* rep) {
  fputs("{\n  \"version\": ", out);
  agoq_info_json_string(out, AGOQ_VERSION_STRING);
  fputs(",\n  \"features\": ", out);
  agoq_info_json_string(out, AGOQ_FEATURES_STRING);
  fputs(",\n  \"plugin\": ", out);
  agoq_info_json_string(out, rep->path);
  fputs(",\n  \"net_versions\": ", out);
  agoq_info_json_versions(out, rep->net_versions, rep->n_net_versions);
  fputs(",\n  \"collnet_versions\": ", out);
  agoq_info_json_versions(out, rep->collnet_versions, rep->n_collnet_versions);
  fputs(",\n  \"profiler_versions\": ", out);
  agoq_info_json_versions(out, rep->profiler_versions, rep->n_profiler_versions);
  fputs(",\n  \"tuner_versions\": ", out);
  agoq_info_json_versions(out, rep->tuner_versions, rep->n_tuner_versions);
  if (rep->net_resolved)
    fprintf(out, ",\n  \"socketNsocks\": %u,\n  \"socketNthreads\": %d", rep->net_cfg.config.nsocks,
            rep->net_cfg.nthreads);
  fprintf(out, ",\n  \"net\": {\n    \"version\": %d,\n    \"name\": ", rep->net.version);
  agoq_info_json_string(out, rep->net.name);
  fputs(",\n    \"error\": ", out);
  if (rep->net_error[0] != '\0')
    agoq_info_json_string(out, rep->net_error);
  else
    fputs("null", out);
  fputs(",\n    \"devices\": [", out);
  for (int d = 0; d < rep->ndev; d++) {
    const agoq_view_props* p = &rep->props[d];
    char ptr[64];
    agoq_info_ptr_support(p->ptr_support, ptr, sizeof ptr);
    fprintf(out, "%s\n      {\"index\": %d, \"name\": ", d > 0 ? "," : "", d);
    agoq_info_json_string(out, p->name);
    const agoq_netif* nif = rep->net_resolved ? agoq_info_net_find(&rep->net_cfg, p->name) : NULL;
    if (nif != NULL) {
      char addr[INET6_ADDRSTRLEN + 8];
      const char *link, *src;
      agoq_info_netif_fields(nif, addr, sizeof addr, &link, &src);
      fputs(", \"address\": ", out);
      agoq_info_json_string(out, addr);
      fprintf(out, ", \"link\": \"%s\", \"speedSource\": \"%s\"", link,
              agoq_netif_speed_source_name(nif->speed_source));
    }
    fputs(", \"pciPath\": ", out);
    if (p->has_pci_path)
      agoq_info_json_string(out, p->pci_path);
    else
      fputs("null", out);
    fprintf(out,
            ", \"speedMbps\": %d, \"ptrSupport\": %d, \"ptrSupportNames\": \"%s\""
            ", \"maxRecvs\": %d, \"maxComms\": %d, \"maxP2pBytes\": %zu"
            ", \"maxCollBytes\": %zu, \"guid\": \"0x%016" PRIx64 "\", \"port\": %d"
            ", \"latencyUs\": %g, \"regIsGlobal\": %d, \"forceFlush\": %d"
            ", \"netDeviceType\": \"%s\", \"netDeviceVersion\": %d, \"vdevCount\": %d"
            ", \"maxMultiRequestSize\": %d}",
            p->speed, p->ptr_support, ptr, p->max_recvs, p->max_comms, p->max_p2p_bytes,
            p->max_coll_bytes, p->guid, p->port, (double)p->latency, p->reg_is_global,
            p->force_flush, agoq_info_device_type(p->net_device_type), p->net_device_version,
            p->vdev_count, p->max_multi_request_size);
  }
  fputs(rep->ndev > 0 ? "\n    ]\n  },\n  \"collnet\": " : "]\n  },\n  \"collnet\": ", out);
  if (!rep->has_collnet) {
    fputs("null\n}\n", out);
    return;
  }
  fprintf(out, "{\"version\": %d, \"name\": ", rep->collnet.version);
  agoq_info_json_string(out, rep->collnet.name);
  fprintf(out, ", \"devices\": %d, \"error\": ", rep->collnet_ndev);
  if (rep->collnet_error[0] != '\0')
    agoq_info_json_string(out, rep->collnet_error);
  else
    fputs("null", out);
  fputs("}\n}\n", out);
}

int agoq_info_devices(FILE* out, const char* lib_path, bool json) {
  agoq_info_report rep;
  memset(&rep, 0, sizeof rep);
  rep.path = lib_path != NULL ? lib_path : agoq_netlib_default_path();

  /* Show the file actually loaded, not "bin/../lib/..." or a symlink. */
  if (realpath(rep.path, rep.resolved) != NULL) rep.path = rep.resolved;
  agoq_log_stderr_set_tap(agoq_info_capture_effect); /* the plugin logs through ours */

  agoq_netlib* lib = NULL;
  if (agoq_netlib_open(rep.path, &lib, rep.open_error, sizeof rep.open_error) != 0) {
    fprintf(stderr, "agoq-info: %s\n", rep.open_error);
    if (lib_path == NULL)
      fputs("agoq-info: build the plugin, or name it with --lib PATH or AGOQ_PLUGIN_PATH\n",
            stderr);
    return 1;
  }
  rep.n_net_versions =
      agoq_netlib_net_versions(lib, rep.net_versions, AGOQ_LOADER_NUM_VERSIONS);
  rep.n_collnet_versions =
      agoq_netlib_collnet_versions(lib, rep.collnet_versions, AGOQ_LOADER_NUM_VERSIONS);
  agoq_info_aux_versions(&rep);
  /* agoq_netlib_open guarantees at least one net version. */
  agoq_info_collect_net(lib, &rep);
  agoq_info_collect_collnet(lib, &rep);
  /* Only after the plugin's own init succeeded: a failure is already reported by it. */
  rep.net_resolved = rep.net_error[0] == '\0' && agoq_info_net_resolve(&rep.net_cfg) == 0;

  if (json)
    agoq_info_print_json(out, &rep);
  else
    agoq_info_print_text(out, &rep);

  /* A device count of zero is a failure to NCCL too: it skips the plugin. */
  int rc = rep.net_error[0] != '\0' || rep.ndev <= 0 ? 1 : 0;
  if (rep.net_error[0] == '\0' && rep.ndev <= 0)
    fputs("agoq-info: the plugin reports no devices; NCCL would not use it\n", stderr);
  free(rep.props);
  agoq_netlib_close(lib);
  return rc;
}
