/* The GID choice of the verbs transport. A wrong GID is the usual cause of RoCE
 * "status=12" retry timeouts at first traffic (NVIDIA/nccl#426, #769), and containers
 * cannot read GID types at all (#1573): so every decision comes back with the entries it
 * passed over and why, for the caller to log. */
#include "agoq_ibport.h"
#include "agoq_ibport_text.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static const char* agoq_ib_errno_text(int e, char* buf, size_t n) {
#if defined(__GLIBC__) && defined(_GNU_SOURCE)
  return strerror_r(e, buf, n);
#else
  if (strerror_r(e, buf, n) != 0) snprintf(buf, n, "errno %d", e);
  return buf;
#endif
}

agoq_ib_gid_policy agoq_ib_gid_policy_default(void) {
  agoq_ib_gid_policy p = {-1, AF_INET, 2};
  return p;
}

static bool agoq_ib_gid_is_zero(const uint8_t raw[16]) {
  for (int i = 0; i < 16; i++)
    if (raw[i] != 0) return false;
  return true;
}

/* fe80:: with nothing else: the placeholder of a port without an address. */
static bool agoq_ib_gid_is_bare_fe80(const uint8_t raw[16]) {
  if (raw[0] != 0xfe || raw[1] != 0x80) return false;
  for (int i = 2; i < 16; i++)
    if (raw[i] != 0) return false;
  return true;
}

bool agoq_ib_gid_is_configured(const uint8_t raw[16]) {
  return raw != NULL && !agoq_ib_gid_is_zero(raw) && !agoq_ib_gid_is_bare_fe80(raw);
}

bool agoq_ib_gid_is_link_local(const uint8_t raw[16]) {
  return raw != NULL && raw[0] == 0xfe && (raw[1] & 0xc0) == 0x80;
}

bool agoq_ib_gid_is_ipv4_mapped(const uint8_t raw[16]) {
  if (raw == NULL) return false;
  for (int i = 0; i < 10; i++)
    if (raw[i] != 0) return false;
  return raw[10] == 0xff && raw[11] == 0xff;
}

void agoq_ib_gid_format(const uint8_t raw[16], char* out, size_t n) {
  if (out == NULL || n == 0) return;
  char text[INET6_ADDRSTRLEN];
  if (raw == NULL || inet_ntop(AF_INET6, raw, text, sizeof text) == NULL) snprintf(text, sizeof text, "?");
  snprintf(out, n, "%s", text);
}

static const char* agoq_ib_family_name(int family) {
  return family == AF_INET ? "IPv4" : family == AF_INET6 ? "IPv6" : "IPv4 or IPv6";
}

static int agoq_ib_gid_family(const uint8_t raw[16]) {
  return agoq_ib_gid_is_ipv4_mapped(raw) ? AF_INET : AF_INET6;
}

static agoq_ib_gid_type agoq_ib_roce_type(int version) {
  return version == 1 ? AGOQ_IB_GID_TYPE_ROCE_V1 : AGOQ_IB_GID_TYPE_ROCE_V2;
}

static int agoq_ib_gid_entries(const agoq_ib_port_info* port) {
  return port->gids != NULL && port->gid_count > 0 ? port->gid_count : 0;
}

/* The type as a log shows it: "RoCE v2", or "unknown (Invalid argument)". */
static const char* agoq_ib_gid_type_text(const agoq_ib_gid_entry* g, char* buf, size_t n) {
  if (g->type != AGOQ_IB_GID_TYPE_UNKNOWN || g->type_errno == 0) return agoq_ib_gid_type_name(g->type);
  char e[96];
  snprintf(buf, n, "unknown (%s)", agoq_ib_errno_text(g->type_errno, e, sizeof e));
  return buf;
}

/* Why a RoCE entry is not a candidate for automatic choice (NULL: it is one, of family
 * *family, with a known type when *known). Independent of the wanted family, which only
 * ranks candidates. */
static const char* agoq_ib_gid_refusal(const agoq_ib_gid_entry* g, agoq_ib_gid_type want, int* family, bool* known,
                                       char* buf, size_t n) {
  if (agoq_ib_gid_is_zero(g->raw)) return "unconfigured (all zero)";
  if (agoq_ib_gid_is_bare_fe80(g->raw)) return "unconfigured (bare fe80::)";
  if (agoq_ib_gid_is_link_local(g->raw)) return "link-local (fe80::/10), not routable";
  if (g->type == AGOQ_IB_GID_TYPE_IB) return "type IB on an Ethernet port";
  if (g->type != AGOQ_IB_GID_TYPE_UNKNOWN && g->type != want) {
    snprintf(buf, n, "%s, not the wanted %s", agoq_ib_gid_type_name(g->type), agoq_ib_gid_type_name(want));
    return buf;
  }
  *family = agoq_ib_gid_family(g->raw);
  *known = g->type != AGOQ_IB_GID_TYPE_UNKNOWN;
  return NULL;
}

/* "[3] ::ffff:10.0.0.5" */
static void agoq_ib_gid_ref(agoq_ib_text* t, const agoq_ib_gid_entry* gids, int i) {
  char text[INET6_ADDRSTRLEN];
  agoq_ib_gid_format(gids[i].raw, text, sizeof text);
  agoq_ib_text_add(t, "[%d] %s", i, text);
}

/* One verdict per entry below `limit` (skipping `skip`), runs of all-zero entries as one
 * "[a-b]" item so a 256-entry table of a fresh port stays one line. */
static void agoq_ib_gid_list_refusals(agoq_ib_text* t, const agoq_ib_port_info* port, agoq_ib_gid_type want,
                                      int family_want, int limit, int skip, int best_tier) {
  bool first = true;
  for (int i = 0; i < limit; i++) {
    if (i == skip) continue;
    const agoq_ib_gid_entry* g = &port->gids[i];
    agoq_ib_text_add(t, "%s", first ? "" : "; ");
    first = false;
    if (agoq_ib_gid_is_zero(g->raw)) {
      int j = i;
      while (j + 1 < limit && j + 1 != skip && agoq_ib_gid_is_zero(port->gids[j + 1].raw)) j++;
      if (j > i)
        agoq_ib_text_add(t, "[%d-%d] unconfigured (all zero)", i, j);
      else
        agoq_ib_text_add(t, "[%d] unconfigured (all zero)", i);
      i = j;
      continue;
    }
    agoq_ib_gid_ref(t, port->gids, i);
    char buf[96], tbuf[128];
    int family = 0;
    bool known = false;
    const char* why = agoq_ib_gid_refusal(g, want, &family, &known, buf, sizeof buf);
    if (why != NULL) {
      agoq_ib_text_add(t, " %s", why);
    } else if (family_want != AF_UNSPEC && family != family_want && best_tier < 2) {
      agoq_ib_text_add(t, " %s, not the wanted %s", agoq_ib_family_name(family), agoq_ib_family_name(family_want));
    } else {
      agoq_ib_text_add(t, " %s %s, ranks lower (a readable type wins)", agoq_ib_family_name(family),
                       agoq_ib_gid_type_text(g, tbuf, sizeof tbuf));
    }
  }
  if (first) agoq_ib_text_add(t, "none");
}

static int agoq_ib_gid_fail(char* reason, size_t reason_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int agoq_ib_gid_fail(char* reason, size_t reason_len, const char* fmt, ...) {
  if (reason != NULL && reason_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, reason_len, fmt, ap);
    va_end(ap);
  }
  return -1;
}

static int agoq_ib_gid_choose_ib(const agoq_ib_port_info* port, const agoq_ib_gid_policy* policy, int* index_out,
                                 agoq_ib_text* t) {
  int count = agoq_ib_gid_entries(port);
  /* On InfiniBand GID 0 is the subnet prefix (fe80:: by default) plus the port GUID:
   * "link-local" in form but what the fabric routes, so only an all-zero entry is bad. */
  int index = policy->index >= 0 ? policy->index : 0;
  const char* why = policy->index >= 0 ? "the index asked for" : "InfiniBand uses GID 0 (the LID routes)";
  if (index >= count) {
    agoq_ib_text_add(t, "GID index %d does not exist on %.63s:%d (InfiniBand, %d entries)", index, port->dev, port->port,
                     count);
    return -1;
  }
  char text[INET6_ADDRSTRLEN];
  agoq_ib_gid_format(port->gids[index].raw, text, sizeof text);
  if (agoq_ib_gid_is_zero(port->gids[index].raw)) {
    agoq_ib_text_add(t, "GID index %d on %.63s:%d (InfiniBand) is unconfigured (all zero)", index, port->dev,
                     port->port);
    return -1;
  }
  *index_out = index;
  agoq_ib_text_add(t, "GID index %d %s (IB) on %.63s:%d: %s", index, text, port->dev, port->port, why);
  return 0;
}

static int agoq_ib_gid_choose_explicit(const agoq_ib_port_info* port, const agoq_ib_gid_policy* policy,
                                       int* index_out, agoq_ib_text* t) {
  int count = agoq_ib_gid_entries(port);
  int index = policy->index;
  if (index >= count) {
    agoq_ib_text_add(t, "GID index %d asked for does not exist on %.63s:%d (RoCE, %d entries, 0..%d)", index,
                     port->dev, port->port, count, count - 1);
    return -1;
  }
  const agoq_ib_gid_entry* g = &port->gids[index];
  if (agoq_ib_gid_is_zero(g->raw)) {
    agoq_ib_text_add(t, "GID index %d asked for on %.63s:%d is unconfigured (all zero): no address on this port", index,
                     port->dev, port->port);
    return -1;
  }
  char text[INET6_ADDRSTRLEN], tbuf[128], e[96];
  agoq_ib_gid_format(g->raw, text, sizeof text);
  int family = agoq_ib_gid_family(g->raw);
  agoq_ib_gid_type want = agoq_ib_roce_type(policy->roce_version);
  agoq_ib_text_add(t, "GID index %d %s (%s, %s) on %.63s:%d: the index asked for", index, text,
                   agoq_ib_gid_type_text(g, tbuf, sizeof tbuf), agoq_ib_family_name(family), port->dev, port->port);
  if (agoq_ib_gid_is_link_local(g->raw))
    agoq_ib_text_add(t, "; warning: link-local (fe80::/10) GIDs do not route beyond the local link");
  if (g->type != AGOQ_IB_GID_TYPE_UNKNOWN && g->type != want)
    agoq_ib_text_add(t, "; warning: its type is %s, not the RoCE version asked for (%s)", agoq_ib_gid_type_name(g->type),
                     agoq_ib_gid_type_name(want));
  else if (g->type == AGOQ_IB_GID_TYPE_UNKNOWN && g->type_errno != 0)
    agoq_ib_text_add(t, "; type unreadable (%s), assumed %s", agoq_ib_errno_text(g->type_errno, e, sizeof e),
                     agoq_ib_gid_type_name(want));
  *index_out = index;
  return 0;
}

static int agoq_ib_gid_choose_auto(const agoq_ib_port_info* port, const agoq_ib_gid_policy* policy, int* index_out,
                                   agoq_ib_text* t) {
  int count = agoq_ib_gid_entries(port);
  agoq_ib_gid_type want = agoq_ib_roce_type(policy->roce_version);
  /* Rank: the wanted family before the other (tier +2), a readable type before an
   * unreadable one (+1); the lowest index among equals, as NCCL's scan finds it. */
  int best = -1, best_tier = 4;
  for (int i = 0; i < count; i++) {
    char buf[96];
    int family = 0;
    bool known = false;
    if (agoq_ib_gid_refusal(&port->gids[i], want, &family, &known, buf, sizeof buf) != NULL) continue;
    int tier = (policy->family == AF_UNSPEC || family == policy->family ? 0 : 2) + (known ? 0 : 1);
    if (tier < best_tier) {
      best_tier = tier;
      best = i;
    }
  }
  if (best < 0) {
    agoq_ib_text_add(t, "no usable GID on %.63s:%d (RoCE; wanted a configured, non-link-local %s %s GID; %d entries): ",
                     port->dev, port->port, agoq_ib_family_name(policy->family), agoq_ib_gid_type_name(want), count);
    agoq_ib_gid_list_refusals(t, port, want, policy->family, count, -1, 0);
    return -1;
  }
  const agoq_ib_gid_entry* g = &port->gids[best];
  char text[INET6_ADDRSTRLEN], e[96];
  agoq_ib_gid_format(g->raw, text, sizeof text);
  int family = agoq_ib_gid_family(g->raw);
  agoq_ib_text_add(t, "GID index %d %s (%s, %s) on %.63s:%d: the lowest-index configured, non-link-local %s %s GID", best,
                   text, agoq_ib_gid_type_name(want), agoq_ib_family_name(family), port->dev, port->port,
                   agoq_ib_family_name(family), agoq_ib_gid_type_name(want));
  if (best_tier & 1)
    agoq_ib_text_add(t, "; type unreadable (%s), assumed %s",
                     g->type_errno != 0 ? agoq_ib_errno_text(g->type_errno, e, sizeof e) : "not read",
                     agoq_ib_gid_type_name(want));
  if (best_tier >= 2)
    agoq_ib_text_add(t, "; no usable %s GID on this port, fell back to %s", agoq_ib_family_name(policy->family),
                     agoq_ib_family_name(family));
  /* The entries that lost to it: with every candidate after `best` of equal or lower
   * rank, the ones before it are the ones a user wonders about. */
  if (best > 0) {
    agoq_ib_text_add(t, "; passed over: ");
    agoq_ib_gid_list_refusals(t, port, want, policy->family, best, best, best_tier);
  }
  *index_out = best;
  return 0;
}

int agoq_ib_gid_choose(const agoq_ib_port_info* port, const agoq_ib_gid_policy* policy, int* index_out, char* reason,
                       size_t reason_len) {
  if (reason != NULL && reason_len > 0) reason[0] = '\0';
  if (port == NULL || index_out == NULL) return agoq_ib_gid_fail(reason, reason_len, "no port or no index to set");
  *index_out = -1;
  agoq_ib_gid_policy p = policy != NULL ? *policy : agoq_ib_gid_policy_default();
  if (p.index < -1)
    return agoq_ib_gid_fail(reason, reason_len, "GID index %d is invalid (-1 = automatic, else 0 or more)", p.index);
  if (p.family != AF_INET && p.family != AF_INET6 && p.family != AF_UNSPEC)
    return agoq_ib_gid_fail(reason, reason_len, "address family %d is invalid (AF_INET, AF_INET6 or AF_UNSPEC)",
                            p.family);
  if (p.roce_version != 1 && p.roce_version != 2)
    return agoq_ib_gid_fail(reason, reason_len, "RoCE version %d is invalid (1 or 2)", p.roce_version);
  agoq_ib_text t = {reason, reason_len, 0};
  if (port->link_layer == AGOQ_IB_LINK_LAYER_INFINIBAND) return agoq_ib_gid_choose_ib(port, &p, index_out, &t);
  if (port->link_layer != AGOQ_IB_LINK_LAYER_ETHERNET)
    return agoq_ib_gid_fail(reason, reason_len, "%.63s:%d has link layer %s (%d): neither InfiniBand nor Ethernet",
                            port->dev, port->port, agoq_ib_link_layer_name(port->link_layer), port->link_layer);
  if (p.index >= 0) return agoq_ib_gid_choose_explicit(port, &p, index_out, &t);
  return agoq_ib_gid_choose_auto(port, &p, index_out, &t);
}

int agoq_ib_gid_table_describe(const agoq_ib_port_info* port, char* out, size_t n) {
  agoq_ib_text t = {out, n, 0};
  if (out != NULL && n > 0) out[0] = '\0';
  if (port == NULL) {
    agoq_ib_text_add(&t, "no port\n");
    return (int)t.len;
  }
  int count = agoq_ib_gid_entries(port);
  bool ib = port->link_layer == AGOQ_IB_LINK_LAYER_INFINIBAND;
  agoq_ib_text_add(&t, "%.63s:%d GID table (%s, %d entries):\n", port->dev, port->port,
                   agoq_ib_link_layer_name(port->link_layer), count);
  for (int i = 0; i < count; i++) {
    const agoq_ib_gid_entry* g = &port->gids[i];
    if (agoq_ib_gid_is_zero(g->raw)) {
      int j = i;
      while (j + 1 < count && agoq_ib_gid_is_zero(port->gids[j + 1].raw)) j++;
      char range[32];
      if (j > i)
        snprintf(range, sizeof range, "[%d-%d]", i, j);
      else
        snprintf(range, sizeof range, "[%d]", i);
      agoq_ib_text_add(&t, "  %-9s %-39s %-8s %s\n", range, "::", "-", "unconfigured (all zero)");
      i = j;
      continue;
    }
    char text[INET6_ADDRSTRLEN], tbuf[128], idx[16];
    agoq_ib_gid_format(g->raw, text, sizeof text);
    snprintf(idx, sizeof idx, "[%d]", i);
    const char* verdict;
    if (ib)
      verdict = "configured";
    else if (agoq_ib_gid_is_bare_fe80(g->raw))
      verdict = "unconfigured (bare fe80::)";
    else if (agoq_ib_gid_is_link_local(g->raw))
      verdict = "link-local, not routable";
    else if (g->type == AGOQ_IB_GID_TYPE_IB)
      verdict = "type IB on an Ethernet port";
    else
      verdict = agoq_ib_gid_is_ipv4_mapped(g->raw) ? "usable (IPv4)" : "usable (IPv6)";
    agoq_ib_text_add(&t, "  %-9s %-39s %-8s %s\n", idx, text, agoq_ib_gid_type_text(g, tbuf, sizeof tbuf), verdict);
  }
  return t.len > (size_t)INT32_MAX ? INT32_MAX : (int)t.len;
}
