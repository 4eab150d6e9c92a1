/* The hwloc XML fixtures through hwloc (dlopened): what the plugin will decide on the
 * node shapes users have. The HGX case is the acceptance test: every GPU gets a
 * NIC under its own PCIe switch and the cores of its own NUMA node. */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_topo.h"

static agoq_topo* load(const char* name) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", AGOQ_TOPO_FIXTURES, name);
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  int rc = agoq_topo_load_xml(path, t);
  if (rc != AGOQ_TOPO_OK) fail_msg("%s: %s", path, agoq_topo_strerror(rc));
  assert_false(t->this_system);
  assert_string_equal(t->source, "hwloc-xml");
  return t;
}

static void test_hgx_every_gpu_on_its_switch_and_node(void** state) {
  (void)state;
  agoq_topo* t = load("hgx-h100.xml");
  assert_int_equal(t->ngpus, 8);
  assert_int_equal(t->nnics, 8);
  assert_int_equal(t->nnuma, 2);
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_true(c.rail_aligned);
  bool used[AGOQ_TOPO_MAX_NICS] = {false};
  cpu_set_t all;
  CPU_ZERO(&all);
  for (int i = 0; i < CPU_SETSIZE; i++) CPU_SET(i, &all);
  for (int g = 0; g < t->ngpus; g++) {
    const agoq_topo_gpu* gpu = &t->gpus[g];
    int k = c.nic[g];
    assert_in_range(k, 0, t->nnics - 1);
    const agoq_topo_nic* nic = &t->nics[k];
    assert_false(used[k]); /* one rail per GPU */
    used[k] = true;
    assert_true(c.path[g] == AGOQ_TOPO_PATH_PIX || c.path[g] == AGOQ_TOPO_PATH_PXB);
    /* Under its own switch: the switch's upstream port (sysfs level 2) is shared. */
    assert_true(gpu->pci.nbridges >= 2 && nic->pci.nbridges >= 2);
    assert_string_equal(gpu->pci.bridges[1], nic->pci.bridges[1]);
    assert_int_equal(gpu->pci.numa, nic->pci.numa);
    /* Cores of its own NUMA node: 0-55 on socket 0, 56-111 on socket 1. */
    cpu_set_t cpus;
    assert_true(agoq_topo_placement_cpus(t, gpu->pci.numa, &all, &cpus));
    assert_int_equal(CPU_COUNT(&cpus), 56);
    int first = gpu->pci.numa == 0 ? 0 : 56;
    for (int cpu = first; cpu < first + 56; cpu++) assert_true(CPU_ISSET(cpu, &cpus));
    /* The pciPath NCCL gets is the NIC's sysfs path, ending in its bus id. */
    size_t n = strlen(nic->pci_path);
    assert_true(n > 12 && strncmp(nic->pci_path, "/sys/devices/pci0000:", 21) == 0);
    assert_string_equal(nic->pci_path + n - 12, nic->pci.busid);
    assert_int_equal(nic->kind, AGOQ_TOPO_NIC_IB);
    assert_true(nic->guid != 0);
  }
  /* Across sockets it must be SYS, across switches of a socket PHB. */
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 7, NULL), AGOQ_TOPO_PATH_SYS);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 2, NULL), AGOQ_TOPO_PATH_PHB);
  free(t);
}

static void test_eight_gpus_two_nics(void** state) {
  (void)state;
  agoq_topo* t = load("gpus8-nics2.xml");
  assert_int_equal(t->ngpus, 8);
  assert_int_equal(t->nnics, 2);
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_false(c.rail_aligned);
  for (int g = 0; g < t->ngpus; g++) {
    assert_int_equal(c.path[g], AGOQ_TOPO_PATH_PXB); /* behind two switch levels */
    assert_int_equal(t->nics[c.nic[g]].pci.numa, t->gpus[g].pci.numa);
  }
  free(t);
}

static void test_vm_no_nic_dual_port(void** state) {
  (void)state;
  agoq_topo* t = load("vm-flat.xml");
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_int_equal(t->ngpus, 4);
  for (int g = 0; g < t->ngpus; g++) {
    assert_int_equal(t->gpus[g].pci.nbridges, 0);
    assert_int_equal(c.path[g], AGOQ_TOPO_PATH_PHB);
  }
  free(t);

  t = load("no-nic.xml");
  agoq_topo_choose(t, &c);
  assert_int_equal(t->ngpus, 2);
  assert_int_equal(t->nnics, 0);
  assert_int_equal(c.nic[0], -1);
  assert_int_equal(c.nic[1], -1);
  free(t);

  t = load("dual-port.xml");
  agoq_topo_choose(t, &c);
  assert_int_equal(t->nnics, 2);
  assert_string_equal(t->nics[0].name, "mlx4_0:1");
  assert_string_equal(t->nics[1].name, "mlx4_0:2");
  assert_string_equal(t->nics[0].netdev, "ib0");
  assert_string_equal(t->nics[1].netdev, "ib1");
  assert_string_equal(t->nics[0].pci.busid, t->nics[1].pci.busid);
  assert_true(t->nics[0].guid == t->nics[1].guid);
  assert_true(c.rail_aligned); /* one port per GPU */
  assert_int_not_equal(c.nic[0], c.nic[1]);
  free(t);
}

/* CUDA ordinals come from the driver's bus ids (8-digit domain, any case) matched to the
 * topology's GPUs; an XML topology never gets ordinals from this machine's driver. */
static void test_cuda_ordinals_by_bus_id(void** state) {
  (void)state;
  assert_true(agoq_topo_busid_equal("00000000:19:00.0", "0000:19:00.0"));
  assert_true(agoq_topo_busid_equal("0000:9A:00.0", "0000:9a:00.0"));
  assert_false(agoq_topo_busid_equal("00000001:19:00.0", "0000:19:00.0"));
  assert_false(agoq_topo_busid_equal("0000:19:00.1", "0000:19:00.0"));
  assert_false(agoq_topo_busid_equal("garbage", "0000:19:00.0"));
  agoq_topo* t = load("hgx-h100.xml");
  assert_int_equal(agoq_topo_cuda_annotate(t), 0); /* not this machine */
  for (int g = 0; g < t->ngpus; g++) assert_int_equal(t->gpus[g].cuda, -1);
  /* The driver enumerates in its own order (here: reversed, one GPU unknown to us). */
  const char* ids[AGOQ_TOPO_MAX_GPUS + 1];
  char buf[AGOQ_TOPO_MAX_GPUS + 1][32];
  int n = 0;
  for (int g = t->ngpus - 1; g >= 0; g--) {
    snprintf(buf[n], sizeof buf[n], "0000%s", t->gpus[g].pci.busid);
    for (char* p = buf[n]; *p; p++) *p = (char)toupper((unsigned char)*p);
    ids[n] = buf[n];
    n++;
  }
  ids[n++] = "00000000:FF:00.0";
  assert_int_equal(agoq_topo_match_cuda(t, ids, n), t->ngpus);
  for (int g = 0; g < t->ngpus; g++) assert_int_equal(t->gpus[g].cuda, t->ngpus - 1 - g);
  free(t);
}

static void test_bad_files_never_fall_back(void** state) {
  (void)state;
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  assert_int_equal(agoq_topo_load_xml("/nonexistent/agoq.xml", t), AGOQ_TOPO_ENOENT);
  static const char bad[] = "<?xml version=\"1.0\"?><topology version=\"2.0\"><object type=\"Machine\">";
  assert_int_equal(agoq_topo_load_xml_buffer(bad, (int)sizeof bad, t), AGOQ_TOPO_EINVAL);
  assert_int_equal(agoq_topo_load_xml_buffer(bad, 0, t), AGOQ_TOPO_EINVAL);

  /* The same document from memory gives the same topology as from the file. */
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/dual-port.xml", AGOQ_TOPO_FIXTURES);
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  assert_int_equal(agoq_topo_load_xml_buffer(buf, (int)n + 1, t), AGOQ_TOPO_OK);
  assert_int_equal(t->ngpus, 2);
  assert_int_equal(t->nnics, 2);
  free(t);
}

int main(void) {
  char why[256];
  if (!agoq_topo_hwloc_available(why, sizeof why)) {
    fprintf(stderr, "hwloc not loadable: %s\n", why);
    return 1; /* built with hwloc but cannot load it: a broken install, not a skip */
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hgx_every_gpu_on_its_switch_and_node),
      cmocka_unit_test(test_eight_gpus_two_nics),
      cmocka_unit_test(test_vm_no_nic_dual_port),
      cmocka_unit_test(test_bad_files_never_fall_back),
      cmocka_unit_test(test_cuda_ordinals_by_bus_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
