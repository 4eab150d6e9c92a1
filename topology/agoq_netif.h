/*
 * Network interfaces as the TCP transport needs them: name, one address, link speed and
 * the PCI device behind it. Knows nothing of NCCL; the interface filter takes the syntax
 * users already know from NCCL_SOCKET_IFNAME.
 */
#ifndef AGOQ_NETIF_H
#define AGOQ_NETIF_H

#include <limits.h>
#include <net/if.h>
#include <sched.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>

#define AGOQ_NETIF_MAX 16
#define AGOQ_NETIF_DEFAULT_SPEED_MBPS 10000

typedef enum { AGOQ_NETIF_FAMILY_ANY = 0, AGOQ_NETIF_FAMILY_IPV4 = 1, AGOQ_NETIF_FAMILY_IPV6 = 2 } agoq_netif_family;

/* Where speed_mbps came from: users must be able to tell a measured link from a guess. */
typedef enum {
  AGOQ_NETIF_SPEED_DEFAULT = 0, /* nothing reported it: AGOQ_NETIF_DEFAULT_SPEED_MBPS */
  AGOQ_NETIF_SPEED_SYSFS,       /* /sys/class/net/<name>/speed (the driver's, as ethtool) */
  AGOQ_NETIF_SPEED_TOPOLOGY,    /* the topology's NIC (sysfs or an InfiniBand port's rate) */
} agoq_netif_speed_source;

typedef struct {
  char name[IF_NAMESIZE + 1];
  struct sockaddr_storage addr; /* port 0 */
  socklen_t addr_len;
  bool running;                 /* IFF_RUNNING: the link has carrier (it is IFF_UP too) */
  int speed_mbps;               /* from sysfs; AGOQ_NETIF_DEFAULT_SPEED_MBPS when unknown */
  agoq_netif_speed_source speed_source;
  bool has_pci_path;
  char pci_path[PATH_MAX];      /* realpath of /sys/class/net/<name>/device, or of its PCI
                                 * device when the topology knows it (agoq_topo_annotate_netifs) */
  int numa_node;                /* NUMA node the NIC is local to; -1 unknown */
  bool has_local_cpus;
  cpu_set_t local_cpus;         /* CPUs of that node (not yet intersected with the process's) */
} agoq_netif;

/* True when `name` passes the filter `spec` (NCCL_SOCKET_IFNAME syntax: comma-separated
 * prefixes; leading '^' = exclude those; leading '=' = exact names; "^=" combines). An
 * empty or NULL spec matches everything. */
bool agoq_netif_spec_match(const char* spec, const char* name);

/* Fills `out` with up to `max` interfaces that are up, have an address of the wanted
 * family and pass `spec`. With an empty spec: every interface except lo and docker*,
 * or lo when nothing else exists (NCCL's default). Returns the count (0 = none),
 * or -1 with errno set when the OS could not be asked. `sysfs_root` is "/sys" except in
 * tests. */
int agoq_netif_discover(const char* spec, agoq_netif_family family, const char* sysfs_root,
                        agoq_netif* out, int max);

/* Reads speed and PCI path for `name` below `sysfs_root` into `nif`. */
void agoq_netif_read_sysfs(const char* sysfs_root, agoq_netif* nif);

/* Every interface of this host, for an error that says what a filter could have matched:
 * "eth0 10.0.0.2 up, lo 127.0.0.1 up, docker0 172.17.0.1 down, ib0 (no address) up" (the
 * IPv4 address if any, else IPv6; "down" = not IFF_UP, "no carrier" = up without
 * IFF_RUNNING). Truncated to len; returns the number of interfaces, -1 if the OS could not
 * be asked. */
int agoq_netif_list_all(char* buf, size_t len);

/* "up", "no carrier" or "down", as agoq_netif_list_all says it. */
const char* agoq_netif_state_name(unsigned ifa_flags);

/* "sysfs", "topology" or "default". */
const char* agoq_netif_speed_source_name(agoq_netif_speed_source s);

/* "name:addr" for logs. */
const char* agoq_netif_describe(const agoq_netif* nif, char* buf, size_t len);

/* Text form of an address with its port: "127.0.0.1:4242", "[fe80::1%2]:4242". */
const char* agoq_sockaddr_str(const struct sockaddr* sa, char* buf, size_t len);

#endif
