/* The fallback without hwloc: a fake sysfs tree with a GPU, a single-port IB NIC with its
 * IP interface, a virtio NIC and lo, as Linux lays them out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agoq_topo.h"
#include "topo_tree.h"


static void link_to(const char* rel_target, const char* rel_link) {
  char target[PATH_MAX], link[PATH_MAX];
  snprintf(target, sizeof target, "%s/%s", root, rel_target);
  snprintf(link, sizeof link, "%s/%s", root, rel_link);
  assert_int_equal(symlink(target, link), 0);
}

#define SW "devices/pci0000:10/0000:10:01.0/0000:11:00.0"
#define GPU SW "/0000:12:00.0/0000:13:00.0"
#define NIC SW "/0000:12:01.0/0000:14:00.0"
#define VIRTIO "devices/pci0000:00/0000:00:03.0"

static int setup(void** state) {
  (void)state;
  snprintf(root, sizeof root, "/tmp/agoq-topo-sysfs-XXXXXX");
  assert_non_null(mkdtemp(root));
  mkdirs("devices/system/node/node0");
  put("devices/system/node/node0/cpulist", "0-3\n");
  put("devices/system/node/node0/meminfo", "Node 0 MemTotal:       1024 kB\n");
  mkdirs(GPU);
  put(GPU "/class", "0x030200\n");
  put(GPU "/vendor", "0x10de\n");
  put(GPU "/device", "0x2330\n");
  put(GPU "/numa_node", "0\n");
  mkdirs(NIC);
  put(NIC "/class", "0x020700\n");
  put(NIC "/vendor", "0x15b3\n");
  put(NIC "/numa_node", "0\n");
  mkdirs(VIRTIO "/virtio2");
  put(VIRTIO "/class", "0x020000\n");
  put(VIRTIO "/vendor", "0x1af4\n");
  put(VIRTIO "/numa_node", "-1\n");
  mkdirs("bus/pci/devices");
  link_to(GPU, "bus/pci/devices/0000:13:00.0");
  link_to(NIC, "bus/pci/devices/0000:14:00.0");
  link_to(VIRTIO, "bus/pci/devices/0000:00:03.0");
  mkdirs("class/infiniband/mlx5_0/ports/1");
  put("class/infiniband/mlx5_0/node_guid", "0c42:a103:0001:1001\n");
  put("class/infiniband/mlx5_0/ports/1/rate", "200 Gb/sec (4X HDR)\n");
  link_to(NIC, "class/infiniband/mlx5_0/device");
  mkdirs("class/net/ib0");
  link_to(NIC, "class/net/ib0/device");
  put("class/net/ib0/dev_port", "0\n");
  mkdirs("class/net/eth0");
  link_to(VIRTIO "/virtio2", "class/net/eth0/device");
  put("class/net/eth0/speed", "25000\n");
  mkdirs("class/net/lo");
  return 0;
}

static int teardown(void** state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_sysfs_discovery(void** state) {
  (void)state;
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  assert_int_equal(agoq_topo_discover_sysfs(root, t), AGOQ_TOPO_OK);
  assert_string_equal(t->source, "sysfs");
  assert_false(t->this_system);
  assert_int_equal(t->nnuma, 1);
  assert_int_equal(CPU_COUNT(&t->numa[0].cpus), 4);
  assert_int_equal(t->numa[0].memory_bytes, 1024u * 1024u);

  assert_int_equal(t->ngpus, 1); /* the NICs are not GPUs */
  assert_string_equal(t->gpus[0].pci.busid, "0000:13:00.0");
  assert_int_equal(t->gpus[0].pci.nbridges, 3);
  assert_int_equal(t->gpus[0].device, 0x2330);

  assert_int_equal(t->nnics, 2); /* lo has no device */
  const agoq_topo_nic* eth = &t->nics[0]; /* 00:03.0 sorts first */
  const agoq_topo_nic* ib = &t->nics[1];
  assert_string_equal(eth->name, "eth0");
  assert_int_equal(eth->kind, AGOQ_TOPO_NIC_NET);
  assert_int_equal(eth->speed_mbps, 25000);
  assert_int_equal(eth->pci.numa, 0); /* numa_node -1 on a one-node machine */
  char want[PATH_MAX];
  snprintf(want, sizeof want, "%s/%s", root, VIRTIO); /* the PCI device, not virtio2 */
  assert_string_equal(eth->pci_path, want);

  assert_string_equal(ib->name, "mlx5_0");
  assert_string_equal(ib->netdev, "ib0");
  assert_int_equal(ib->kind, AGOQ_TOPO_NIC_IB);
  assert_int_equal(ib->port, 1);
  assert_int_equal(ib->speed_mbps, 200000);
  assert_true(ib->guid == 0x0c42a10300011001ull);
  snprintf(want, sizeof want, "%s/%s", root, NIC);
  assert_string_equal(ib->pci_path, want);

  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_true(c.rail_aligned);
  assert_int_equal(c.nic[0], 1);
  assert_int_equal(c.path[0], AGOQ_TOPO_PATH_PIX);
  free(t);
}

/* A missing directory, or one that is not a sysfs tree, is an error, not an empty machine;
 * a sysfs with class/net or bus/pci but no devices is an empty machine. */
static void test_sysfs_not_a_sysfs_root(void** state) {
  (void)state;
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  assert_int_equal(agoq_topo_discover_sysfs("/nonexistent-agoq-root", t), AGOQ_TOPO_ENOSYSFS);
  char dir[sizeof root + 16];
  snprintf(dir, sizeof dir, "%s/devices", root); /* exists, but is no sysfs root */
  assert_int_equal(agoq_topo_discover_sysfs(dir, t), AGOQ_TOPO_ENOSYSFS);
  assert_non_null(strstr(agoq_topo_strerror(AGOQ_TOPO_ENOSYSFS), "class/net"));
  /* A root with class/net and nothing else is a (tiny) sysfs tree: an empty machine. Made
   * under the fixture's root, which teardown removes. */
  mkdirs("empty/class/net");
  char empty[sizeof root + 16];
  snprintf(empty, sizeof empty, "%s/empty", root);
  assert_int_equal(agoq_topo_discover_sysfs(empty, t), AGOQ_TOPO_OK);
  assert_int_equal(t->ngpus + t->nnics + t->nnuma, 0);
  assert_int_equal(agoq_topo_discover_sysfs(NULL, t), AGOQ_TOPO_EINVAL);
  free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_sysfs_discovery),
      cmocka_unit_test(test_sysfs_not_a_sysfs_root),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
