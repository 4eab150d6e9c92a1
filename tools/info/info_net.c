/* agoq-info: what the plugin's init resolves from the environment (interfaces, their
 * address, carrier and speed source, sockets and threads), through the plugin's own code
 * (plugin/transport/tcp/agoq_tcp.h), never recomputed here. */
#include <stdio.h>
#include <string.h>

#include "agoq_info.h"
#include "core/agoq_params.h"
#include "transport/tcp/agoq_tcp.h"

/* "10.0.0.2" (no port) of an interface. */
static void agoq_info_netif_addr(const agoq_netif* nif, char* buf, size_t len) {
  char desc[IF_NAMESIZE + INET6_ADDRSTRLEN + 32];
  agoq_netif_describe(nif, desc, sizeof desc); /* "name:addr" */
  const char* addr = desc + strlen(nif->name) + 1;
  snprintf(buf, len, "%s", addr[0] == '[' ? addr + 1 : addr);
  char* close = strrchr(buf, ']');
  if (close != NULL) *close = '\0';
}

int agoq_info_net_resolve(agoq_info_net* n) {
  memset(n, 0, sizeof *n);
  if (agoq_tcp_config_resolve(&n->config) != ncclSuccess) return -1;
  n->nthreads = agoq_progress_nthreads();
  n->nthreads_auto = agoq_param_int(AGOQ_PARAM_SOCKET_NTHREADS) == 0;
  n->nsocks_auto = agoq_param_int(AGOQ_PARAM_SOCKET_NSOCKS) == 0;
  return 0;
}

const agoq_netif* agoq_info_net_find(const agoq_info_net* n, const char* name) {
  for (int i = 0; name != NULL && i < n->config.nifs; i++)
    if (strcmp(n->config.ifs[i].name, name) == 0) return &n->config.ifs[i];
  return NULL;
}

void agoq_info_netif_fields(const agoq_netif* nif, char* addr, size_t addr_len, const char** link,
                            const char** speed_source) {
  agoq_info_netif_addr(nif, addr, addr_len);
  *link = nif->running ? "up" : "no carrier";
  *speed_source = nif->speed_source == AGOQ_NETIF_SPEED_DEFAULT ? "default (not reported; assumed)"
                  : nif->speed_source == AGOQ_NETIF_SPEED_SYSFS ? "measured (sysfs, as ethtool)"
                                                                : "measured (topology)";
}

void agoq_info_net_print_buffers(FILE* out, const agoq_info_net* n, int dev) {
  /* What a socket of this process gets: the plugin's own rules on its algorithm. */
  char cc[16];
  agoq_tcp_cc_effective(&n->config, dev, cc);
  bool paces = agoq_tcp_cc_paces(cc);
  int snd, rcv;
  agoq_tcp_buffer_sizes(&n->config, dev, paces, &snd, &rcv);
  char s[32] = "autotuning", r[32] = "autotuning", inl[48] = "every message";
  if (snd > 0) snprintf(s, sizeof s, "%d KiB", snd >> 10);
  if (rcv > 0) snprintf(r, sizeof r, "%d KiB", rcv >> 10);
  uint64_t im = agoq_tcp_inline_max(&n->config, dev, paces);
  if (im != UINT64_MAX) snprintf(inl, sizeof inl, "up to %llu B", (unsigned long long)im);
  fprintf(out, "      TCP congestion control %s%s; socket buffers: send %s, receive %s%s\n", cc[0] ? cc : "unknown",
          n->config.cc[0] ? " (AGOQ_SOCKET_CC)" : n->config.cc_auto ? " (AGOQ_SOCKET_CC=auto)" : "", s, r,
          n->config.sndbuf == AGOQ_TCP_BUF_AUTO || n->config.rcvbuf == AGOQ_TCP_BUF_AUTO
              ? " (auto: by interface and algorithm)" : "");
  fprintf(out, "      on the caller's thread: %s%s\n", inl,
          n->config.inline_max == AGOQ_TCP_INLINE_AUTO ? " (AGOQ_SOCKET_INLINE=auto)" : "");
}

void agoq_info_net_print_counts(FILE* out, const agoq_info_net* n) {
  fprintf(out, "%-20s %u per connection%s\n", "data sockets:", n->config.nsocks,
          n->nsocks_auto ? " (AGOQ_SOCKET_NSOCKS=0: auto)" : "");
  fprintf(out, "%-20s %d%s\n", "progress threads:", n->nthreads,
          n->nthreads_auto ? " (AGOQ_SOCKET_NTHREADS=0: auto)" : "");
}

int agoq_info_config_interfaces(FILE* out) {
  agoq_info_net n;
  fprintf(out, "\ninterfaces, as the plugin's init resolves them (AGOQ_SOCKET_IFNAME=\"%s\" [%s]):\n",
          agoq_param_str(AGOQ_PARAM_SOCKET_IFNAME), agoq_param_source(AGOQ_PARAM_SOCKET_IFNAME));
  if (agoq_info_net_resolve(&n) != 0) {
    /* The plugin's own WARN (on stderr) lists the interfaces this host has. */
    char all[1024];
    if (agoq_netif_list_all(all, sizeof all) < 0) snprintf(all, sizeof all, "(cannot list them)");
    fprintf(out, "  none matches: NCCL would fail to initialise the plugin\n");
    fprintf(out, "  this host has: %s\n", all[0] ? all : "no interfaces");
    fprintf(stderr, "agoq-info: no interface matches AGOQ_SOCKET_IFNAME; NCCL would fail to "
            "initialise the plugin\n");
    return 1;
  }
  for (int i = 0; i < n.config.nifs; i++) {
    const agoq_netif* nif = &n.config.ifs[i];
    char addr[INET6_ADDRSTRLEN + 8];
    const char *link, *src;
    agoq_info_netif_fields(nif, addr, sizeof addr, &link, &src);
    fprintf(out, "  [%d] %-10s %-24s link %-10s speed %d Mbps, %s\n", i, nif->name, addr, link,
            nif->speed_mbps, src);
    agoq_info_net_print_buffers(out, &n, i);
  }
  agoq_info_net_print_counts(out, &n);
  return 0;
}
