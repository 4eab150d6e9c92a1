/* Path rules (NCCL's PIX/PXB/PHB/SYS), NIC choice and placement on hand-built topologies:
 * no hwloc needed, so these run in every build. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_topo.h"
#include "agoq_topo_internal.h"

/* A PCI location from a sysfs-like list: "pci0000:10", bridges..., device. */
static agoq_topo_pci loc(int numa, const char* path) {
  agoq_topo_pci p;
  assert_true(agoq_topo_parse_sysfs_path(path, &p));
  p.numa = numa;
  return p;
}

static agoq_topo* new_topo(int nnuma) {
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  for (int i = 0; i < nnuma; i++) {
    t->numa[i].os_index = i;
    for (int c = 0; c < 8; c++) CPU_SET(i * 8 + c, &t->numa[i].cpus);
  }
  t->nnuma = nnuma;
  return t;
}

static void add_gpu(agoq_topo* t, agoq_topo_pci p) {
  t->gpus[t->ngpus].pci = p;
  t->gpus[t->ngpus].vendor = 0x10de;
  t->ngpus++;
}

static void add_nic(agoq_topo* t, const char* name, agoq_topo_pci p) {
  agoq_topo_nic* n = &t->nics[t->nnics++];
  strcpy(n->name, name);
  n->has_pci = true;
  n->pci = p;
}

#define SW0 "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0"
#define SW1 "/sys/devices/pci0000:40/0000:40:01.0/0000:41:00.0"

static void test_path_types(void** state) {
  (void)state;
  int hops;
  agoq_topo_pci gpu = loc(0, SW0 "/0000:12:00.0/0000:13:00.0");
  agoq_topo_pci nic_same = loc(0, SW0 "/0000:12:01.0/0000:14:00.0");
  agoq_topo_pci nic_other_sw = loc(0, SW1 "/0000:42:01.0/0000:44:00.0");
  agoq_topo_pci nic_other_numa = loc(1, "/sys/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:01.0/0000:94:00.0");
  /* Two-level switch: the GPU sits under a second switch below a port of the first. */
  agoq_topo_pci gpu_deep = loc(0, SW0 "/0000:12:02.0/0000:15:00.0/0000:16:00.0/0000:17:00.0");
  agoq_topo_pci nic_flat = loc(0, "/sys/devices/pci0000:00/0000:00:03.0");
  agoq_topo_pci gpu_flat = loc(0, "/sys/devices/pci0000:00/0000:00:05.0");

  assert_int_equal(agoq_topo_pci_path(&gpu, &gpu, &hops), AGOQ_TOPO_PATH_LOC);
  assert_int_equal(hops, 0);
  assert_int_equal(agoq_topo_pci_path(&gpu, &nic_same, &hops), AGOQ_TOPO_PATH_PIX);
  assert_int_equal(hops, 2);
  assert_int_equal(agoq_topo_pci_path(&gpu_deep, &nic_same, &hops), AGOQ_TOPO_PATH_PXB);
  assert_int_equal(hops, 3);
  assert_int_equal(agoq_topo_pci_path(&gpu, &nic_other_sw, &hops), AGOQ_TOPO_PATH_PHB);
  assert_int_equal(hops, 4);
  assert_int_equal(agoq_topo_pci_path(&gpu, &nic_other_numa, &hops), AGOQ_TOPO_PATH_SYS);
  assert_int_equal(hops, 5);
  assert_int_equal(agoq_topo_pci_path(&gpu_flat, &nic_flat, &hops), AGOQ_TOPO_PATH_PHB);
  assert_int_equal(hops, 2);
  /* Symmetric. */
  assert_int_equal(agoq_topo_pci_path(&nic_same, &gpu_deep, NULL), AGOQ_TOPO_PATH_PXB);
}

static bool nvl_for_13(void* arg, const char* gpu, const char* nic) {
  (*(int*)arg)++;
  (void)nic;
  return strcmp(gpu, "0000:13:00.0") == 0;
}

static void test_virtual_nic_and_nvl_hook(void** state) {
  (void)state;
  agoq_topo* t = new_topo(2);
  add_gpu(t, loc(0, SW0 "/0000:12:00.0/0000:13:00.0"));
  add_gpu(t, loc(1, "/sys/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:00.0/0000:93:00.0"));
  strcpy(t->nics[0].name, "veth0"); /* no PCI device: NCCL hangs it under the first CPU */
  t->nnics = 1;
  int hops;
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 0, &hops), AGOQ_TOPO_PATH_PHB);
  assert_int_equal(hops, 2);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 1, 0, NULL), AGOQ_TOPO_PATH_SYS);

  add_nic(t, "mlx5_0", loc(1, "/sys/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:01.0/0000:94:00.0"));
  int calls = 0;
  agoq_topo_set_nvl_hook(nvl_for_13, &calls);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 1, NULL), AGOQ_TOPO_PATH_NVL);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 1, 1, NULL), AGOQ_TOPO_PATH_PIX);
  assert_int_equal(calls, 2);
  agoq_topo_set_nvl_hook(NULL, NULL);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 1, NULL), AGOQ_TOPO_PATH_SYS);
  free(t);
}

static void test_choose_rail_aligned(void** state) {
  (void)state;
  agoq_topo* t = new_topo(1);
  /* NIC order deliberately differs from GPU order within each switch. */
  add_gpu(t, loc(0, SW0 "/0000:12:00.0/0000:13:00.0"));
  add_gpu(t, loc(0, SW0 "/0000:12:02.0/0000:15:00.0"));
  add_gpu(t, loc(0, SW1 "/0000:42:00.0/0000:43:00.0"));
  add_gpu(t, loc(0, SW1 "/0000:42:02.0/0000:45:00.0"));
  add_nic(t, "nicB0", loc(0, SW1 "/0000:42:01.0/0000:44:00.0"));
  add_nic(t, "nicB1", loc(0, SW1 "/0000:42:03.0/0000:46:00.0"));
  add_nic(t, "nicA0", loc(0, SW0 "/0000:12:01.0/0000:14:00.0"));
  add_nic(t, "nicA1", loc(0, SW0 "/0000:12:03.0/0000:16:00.0"));
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_true(c.rail_aligned);
  assert_int_equal(c.nic[0], 2);
  assert_int_equal(c.nic[1], 3);
  assert_int_equal(c.nic[2], 0);
  assert_int_equal(c.nic[3], 1);
  for (int g = 0; g < 4; g++) assert_int_equal(c.path[g], AGOQ_TOPO_PATH_PIX);

  /* A fifth GPU on switch A breaks the 1:1 pairing: nearest NIC for everyone. */
  add_gpu(t, loc(0, SW0 "/0000:12:04.0/0000:17:00.0"));
  agoq_topo_choose(t, &c);
  assert_false(c.rail_aligned);
  assert_int_equal(c.nic[0], 2);
  assert_int_equal(c.nic[1], 2); /* same type and hops as nicA1: the lower index wins */
  assert_int_equal(c.nic[4], 2);
  assert_int_equal(c.nic[2], 0);
  free(t);
}

static void test_choose_nearest_prefers_type_then_hops(void** state) {
  (void)state;
  agoq_topo* t = new_topo(2);
  add_gpu(t, loc(1, "/sys/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:00.0/0000:93:00.0"));
  add_gpu(t, loc(0, SW0 "/0000:12:02.0/0000:15:00.0/0000:16:00.0/0000:17:00.0"));
  add_nic(t, "far", loc(0, SW1 "/0000:42:01.0/0000:44:00.0"));       /* SYS for GPU0, PHB for GPU1 */
  add_nic(t, "cpu1", loc(1, "/sys/devices/pci0000:a0/0000:a0:01.0")); /* PHB for GPU0 */
  add_nic(t, "pxb", loc(0, SW0 "/0000:12:01.0/0000:14:00.0"));       /* PXB for GPU1 */
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_false(c.rail_aligned);
  assert_int_equal(c.nic[0], 1);
  assert_int_equal(c.path[0], AGOQ_TOPO_PATH_PHB);
  assert_int_equal(c.nic[1], 2);
  assert_int_equal(c.path[1], AGOQ_TOPO_PATH_PXB);
  free(t);
}

static void test_choose_without_nics_or_gpus(void** state) {
  (void)state;
  agoq_topo* t = new_topo(1);
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_false(c.rail_aligned);
  add_gpu(t, loc(0, SW0 "/0000:12:00.0/0000:13:00.0"));
  agoq_topo_choose(t, &c);
  assert_int_equal(c.nic[0], -1);
  free(t);
}

static void test_placement_cpus(void** state) {
  (void)state;
  agoq_topo* t = new_topo(2); /* node 0: 0-7, node 1: 8-15 */
  cpu_set_t allowed, out;
  CPU_ZERO(&allowed);
  for (int c = 4; c < 12; c++) CPU_SET(c, &allowed);
  char buf[64];
  assert_true(agoq_topo_placement_cpus(t, 1, &allowed, &out));
  assert_string_equal(agoq_topo_cpulist(&out, buf, sizeof buf), "8-11");
  CPU_ZERO(&allowed);
  CPU_SET(2, &allowed);
  assert_false(agoq_topo_placement_cpus(t, 1, &allowed, &out)); /* never outside the allowed set */
  assert_int_equal(CPU_COUNT(&out), 0);
  assert_false(agoq_topo_placement_cpus(t, 7, &allowed, &out)); /* unknown node */
  free(t);
}

static void test_cpulist_and_sysfs_path(void** state) {
  (void)state;
  cpu_set_t s;
  char buf[64];
  assert_int_equal(agoq_topo_cpulist_parse("0-3,8,10-11\n", &s), 0);
  assert_int_equal(CPU_COUNT(&s), 7);
  assert_string_equal(agoq_topo_cpulist(&s, buf, sizeof buf), "0-3,8,10-11");
  assert_int_equal(agoq_topo_cpulist_parse("", &s), 0);
  assert_string_equal(agoq_topo_cpulist(&s, buf, sizeof buf), "");
  assert_int_equal(agoq_topo_cpulist_parse("3-1", &s), -1);
  assert_int_equal(agoq_topo_cpulist_parse("1,x", &s), -1);
  assert_int_equal(agoq_topo_cpulist_parse("99999", &s), -1);
  assert_int_equal(agoq_topo_cpulist_parse("0-2", &s), 0);
  assert_string_equal(agoq_topo_cpulist(&s, buf, 4), "0-2"); /* fits exactly */
  assert_string_equal(agoq_topo_cpulist(&s, buf, 3), "");    /* never half a range */

  agoq_topo_pci p = loc(0, "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:14:00.0/net/ib0");
  assert_string_equal(p.busid, "0000:14:00.0");
  assert_int_equal(p.nbridges, 3);
  assert_int_equal(p.root_bus, 0x10);
  char path[PATH_MAX];
  agoq_topo_pci_sysfs_path(&p, path, sizeof path);
  assert_string_equal(path, "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:14:00.0");
  assert_false(agoq_topo_parse_sysfs_path("/sys/devices/virtual/net/lo", &p));
  assert_false(agoq_topo_parse_sysfs_path("/sys/devices/pci0000:00/virtio2", &p));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_path_types),
      cmocka_unit_test(test_virtual_nic_and_nvl_hook),
      cmocka_unit_test(test_choose_rail_aligned),
      cmocka_unit_test(test_choose_nearest_prefers_type_then_hops),
      cmocka_unit_test(test_choose_without_nics_or_gpus),
      cmocka_unit_test(test_placement_cpus),
      cmocka_unit_test(test_cpulist_and_sysfs_path),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
