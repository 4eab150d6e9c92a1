#include "agoq_netif.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Matches one comma-separated list entry against name: prefix or exact. */
static bool agoq_netif_entry_match(const char* entry, size_t entry_len, const char* name, bool exact) {
  /* NCCL lets an entry carry ":port"; the port is meaningless for an interface filter. */
  const char* colon = memchr(entry, ':', entry_len);
  if (colon != NULL) entry_len = (size_t)(colon - entry);
  if (entry_len == 0) return false;
  if (exact) return strlen(name) == entry_len && strncmp(name, entry, entry_len) == 0;
  return strncmp(name, entry, entry_len) == 0;
}

bool agoq_netif_spec_match(const char* spec, const char* name) {
  if (spec == NULL || *spec == '\0') return true;
  bool exclude = false, exact = false;
  if (*spec == '^') {
    exclude = true;
    spec++;
  }
  if (*spec == '=') {
    exact = true;
    spec++;
  }
  bool listed = false;
  const char* p = spec;
  while (*p != '\0' && !listed) {
    const char* comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    listed = agoq_netif_entry_match(p, len, name, exact);
    p += len;
    if (*p == ',') p++;
  }
  return exclude ? !listed : listed;
}

static int agoq_netif_read_int(const char* path, int* value) {
  FILE* f = fopen(path, "r");
  if (f == NULL) return -1;
  int rc = fscanf(f, "%d", value) == 1 ? 0 : -1;
  fclose(f);
  return rc;
}

void agoq_netif_read_sysfs(const char* sysfs_root, agoq_netif* nif) {
  char path[PATH_MAX];
  int speed = -1;
  snprintf(path, sizeof path, "%s/class/net/%s/speed", sysfs_root, nif->name);
  /* Virtual interfaces (lo, veth in some kernels) report nothing or -1: keep NCCL's
   * default so the bandwidth model does not think the link is dead. */
  nif->speed_source = AGOQ_NETIF_SPEED_SYSFS;
  if (agoq_netif_read_int(path, &speed) != 0 || speed <= 0) {
    speed = AGOQ_NETIF_DEFAULT_SPEED_MBPS;
    nif->speed_source = AGOQ_NETIF_SPEED_DEFAULT;
  }
  nif->speed_mbps = speed;

  snprintf(path, sizeof path, "%s/class/net/%s/device", sysfs_root, nif->name);
  char* real = realpath(path, NULL);
  nif->has_pci_path = real != NULL && strlen(real) < sizeof nif->pci_path;
  if (nif->has_pci_path) strcpy(nif->pci_path, real);
  else nif->pci_path[0] = '\0';
  free(real);
}

static bool agoq_netif_family_ok(int family, agoq_netif_family want) {
  if (family == AF_INET) return want != AGOQ_NETIF_FAMILY_IPV6;
  if (family == AF_INET6) return want != AGOQ_NETIF_FAMILY_IPV4;
  return false;
}

/* One pass over getifaddrs: interfaces passing `spec`, IPv4 first when family is ANY. */
static int agoq_netif_collect(struct ifaddrs* list, const char* spec, agoq_netif_family family,
                              const char* sysfs_root, agoq_netif* out, int max) {
  int count = 0;
  for (int pass = 0; pass < 2; pass++) {
    int pass_family = pass == 0 ? AF_INET : AF_INET6;
    for (struct ifaddrs* ifa = list; ifa != NULL && count < max; ifa = ifa->ifa_next) {
      if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != pass_family) continue;
      if (!agoq_netif_family_ok(pass_family, family)) continue;
      if (!(ifa->ifa_flags & IFF_UP)) continue;
      if (!agoq_netif_spec_match(spec, ifa->ifa_name)) continue;
      if (strlen(ifa->ifa_name) > IF_NAMESIZE) continue;
      bool seen = false;
      for (int i = 0; i < count; i++) seen |= strcmp(out[i].name, ifa->ifa_name) == 0;
      if (seen) continue; /* one address per interface: the first of the preferred family */
      agoq_netif* nif = &out[count++];
      memset(nif, 0, sizeof *nif);
      strcpy(nif->name, ifa->ifa_name);
      nif->addr_len = pass_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
      memcpy(&nif->addr, ifa->ifa_addr, nif->addr_len);
      nif->running = (ifa->ifa_flags & IFF_RUNNING) != 0;
      nif->numa_node = -1; /* the topology fills it in (agoq_topo_annotate_netifs) */
      agoq_netif_read_sysfs(sysfs_root, nif);
    }
  }
  return count;
}

int agoq_netif_discover(const char* spec, agoq_netif_family family, const char* sysfs_root,
                        agoq_netif* out, int max) {
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) return -1;
  int count;
  if (spec != NULL && *spec != '\0') {
    count = agoq_netif_collect(list, spec, family, sysfs_root, out, max);
  } else {
    count = agoq_netif_collect(list, "^docker,lo", family, sysfs_root, out, max);
    if (count == 0) count = agoq_netif_collect(list, "=lo", family, sysfs_root, out, max);
  }
  freeifaddrs(list);
  return count;
}

const char* agoq_netif_state_name(unsigned ifa_flags) {
  if (!(ifa_flags & IFF_UP)) return "down";
  return (ifa_flags & IFF_RUNNING) ? "up" : "no carrier";
}

const char* agoq_netif_speed_source_name(agoq_netif_speed_source s) {
  switch (s) {
    case AGOQ_NETIF_SPEED_SYSFS: return "sysfs";
    case AGOQ_NETIF_SPEED_TOPOLOGY: return "topology";
    default: return "default";
  }
}

int agoq_netif_list_all(char* buf, size_t len) {
  if (len > 0) buf[0] = '\0';
  struct ifaddrs* list = NULL;
  if (getifaddrs(&list) != 0) return -1;
  int count = 0;
  size_t off = 0;
  /* getifaddrs lists an interface once per address (and once for AF_PACKET): one entry per
   * name, with its best address (IPv4 before IPv6). */
  for (struct ifaddrs* ifa = list; ifa != NULL; ifa = ifa->ifa_next) {
    bool first = true;
    for (struct ifaddrs* p = list; p != ifa && first; p = p->ifa_next) first = strcmp(p->ifa_name, ifa->ifa_name) != 0;
    if (!first) continue;
    const struct sockaddr* best = NULL;
    unsigned flags = ifa->ifa_flags;
    for (struct ifaddrs* p = ifa; p != NULL; p = p->ifa_next) {
      if (strcmp(p->ifa_name, ifa->ifa_name) != 0 || p->ifa_addr == NULL) continue;
      int fam = p->ifa_addr->sa_family;
      if (fam == AF_INET && (best == NULL || best->sa_family != AF_INET)) best = p->ifa_addr;
      else if (fam == AF_INET6 && best == NULL) best = p->ifa_addr;
    }
    char addr[INET6_ADDRSTRLEN + 16] = "(no address)";
    if (best != NULL) {
      agoq_sockaddr_str(best, addr, sizeof addr);
      char* colon = strrchr(addr, ':'); /* drop the ":0" port */
      if (colon != NULL) *colon = '\0';
      if (addr[0] == '[') { /* "[fe80::1%2]" -> "fe80::1%2" */
        memmove(addr, addr + 1, strlen(addr));
        char* close = strrchr(addr, ']');
        if (close != NULL) *close = '\0';
      }
    }
    if (off < len)
      off += (size_t)snprintf(buf + off, len - off, "%s%s %s %s", count ? ", " : "", ifa->ifa_name, addr,
                              agoq_netif_state_name(flags));
    count++;
  }
  freeifaddrs(list);
  return count;
}

const char* agoq_sockaddr_str(const struct sockaddr* sa, char* buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (sa->sa_family == AF_INET) {
    const struct sockaddr_in* in = (const struct sockaddr_in*)sa;
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
  } else if (sa->sa_family == AF_INET6) {
    const struct sockaddr_in6* in6 = (const struct sockaddr_in6*)sa;
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    if (in6->sin6_scope_id != 0)
      snprintf(buf, len, "[%s%%%u]:%u", host, in6->sin6_scope_id, ntohs(in6->sin6_port));
    else
      snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
  } else {
    snprintf(buf, len, "(family %d)", sa->sa_family);
  }
  return buf;
}

const char* agoq_netif_describe(const agoq_netif* nif, char* buf, size_t len) {
  char addr[INET6_ADDRSTRLEN + 16];
  agoq_sockaddr_str((const struct sockaddr*)&nif->addr, addr, sizeof addr);
  /* Drop the ":0" port: an interface address has none. */
  char* colon = strrchr(addr, ':');
  if (colon != NULL) *colon = '\0';
  snprintf(buf, len, "%s:%s", nif->name, addr);
  return buf;
}
