/* NVLink facts: the NVML loader against the fake NVML (tests/topo/fake_nvml.c), GPU-GPU
 * paths and NV#, PXN (a NIC through an NVLink peer GPU) in the paths and the NIC choice,
 * and that without NVML nothing changes. The hand-built cases need no hwloc; the fixture
 * cases load hwloc XML files and annotate them from the fake. */
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_topo.h"
#include "agoq_topo_internal.h"

typedef int (*fake_int_fn)(void);
typedef void (*fake_void_fn)(void);
typedef int (*fake_count_fn)(unsigned*);
typedef int (*fake_handle_fn)(unsigned, void**);
typedef int (*fake_link_fn)(void*, unsigned, int*);

/* The fake, opened once and kept: its counters live as long as the process. */
static void* fake_lib(void) {
  static void* lib;
  if (lib == NULL) lib = dlopen(AGOQ_FAKE_NVML_PATH, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) fail_msg("%s", dlerror());
  return lib;
}

static int fake_call(const char* name) {
  void* lib = fake_lib();
  fake_int_fn fn = (fake_int_fn)dlsym(lib, name);
  assert_non_null(fn);
  return fn();
}

static void fake_reset(void) {
  void* lib = fake_lib();
  fake_void_fn fn = (fake_void_fn)dlsym(lib, "agoq_fake_nvml_reset");
  assert_non_null(fn);
  fn();
}

/* After every annotation: no call a correct NVML user never makes, every init shut down. */
static void assert_fake_clean(void) {
  assert_int_equal(fake_call("agoq_fake_nvml_misuse"), 0);
  assert_int_equal(fake_call("agoq_fake_nvml_refcount"), 0);
}

/* ---- hand-built topologies ------------------------------------------------------------ */

static agoq_topo_pci loc(int numa, const char* path) {
  agoq_topo_pci p;
  assert_true(agoq_topo_parse_sysfs_path(path, &p));
  p.numa = numa;
  return p;
}

static agoq_topo* new_topo(void) {
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  t->numa[0].os_index = 0;
  for (int c = 0; c < 8; c++) CPU_SET(c, &t->numa[0].cpus);
  t->nnuma = 1;
  return t;
}

static void add_gpu(agoq_topo* t, agoq_topo_pci p) {
  t->gpus[t->ngpus].pci = p;
  t->gpus[t->ngpus].vendor = 0x10de;
  t->gpus[t->ngpus].cuda = -1;
  t->ngpus++;
}

static void add_nic(agoq_topo* t, const char* name, agoq_topo_pci p) {
  agoq_topo_nic* n = &t->nics[t->nnics++];
  strcpy(n->name, name);
  n->has_pci = true;
  n->pci = p;
}

/* `count` NVLinks from GPU a to GPU b, both directions, as NVML would report them. */
static void link_gpus(agoq_topo* t, int a, int b, int count) {
  for (int side = 0; side < 2; side++) {
    agoq_topo_gpu* g = &t->gpus[side ? b : a];
    g->nvml = true;
    for (int i = 0; i < count; i++) {
      agoq_topo_nvlink* l = &g->nvlink[g->nvlinks];
      l->link = g->nvlinks++;
      l->remote = AGOQ_TOPO_NVL_GPU;
      l->gpu = side ? a : b;
      strcpy(l->busid, t->gpus[side ? a : b].pci.busid);
    }
  }
  t->nvml_state = AGOQ_TOPO_NVML_LOADED;
}

#define SWA "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0"
#define SWB "/sys/devices/pci0000:20/0000:20:01.0/0000:21:00.0"

/* GPU0 and NIC0 under switch A; GPU1 under switch B with no NIC (one NUMA node). Over
 * PCIe GPU1 reaches NIC0 through the CPU (PHB); with an NVLink to GPU0, NCCL sends it
 * through GPU0 (PXN), and so does the choice. */
static void test_pxn_choice(void** state) {
  (void)state;
  agoq_topo* t = new_topo();
  add_gpu(t, loc(0, SWA "/0000:12:00.0/0000:13:00.0"));
  add_gpu(t, loc(0, SWB "/0000:22:00.0/0000:23:00.0"));
  add_nic(t, "nic0", loc(0, SWA "/0000:12:01.0/0000:14:00.0"));
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_false(c.rail_aligned);
  assert_int_equal(c.nic[1], 0);
  assert_int_equal(c.path[1], AGOQ_TOPO_PATH_PHB);
  assert_int_equal(c.via[1], -1);
  assert_int_equal(agoq_topo_gpu_gpu_path(t, 0, 1, NULL), AGOQ_TOPO_PATH_PHB);
  assert_int_equal(agoq_topo_nic_local_gpu(t, 0), 0);

  link_gpus(t, 0, 1, 4);
  int hops = -1, via = -2;
  assert_int_equal(agoq_topo_gpu_nvlinks(t, 0, 1), 4);
  assert_int_equal(agoq_topo_gpu_gpu_path(t, 1, 0, &hops), AGOQ_TOPO_PATH_NVL);
  assert_int_equal(hops, 1);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 1, 0, &hops, &via), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(via, 0);
  assert_int_equal(hops, 1 + 2); /* NVLink to GPU0, then GPU0-switch-NIC */
  assert_int_equal(agoq_topo_gpu_nic_path(t, 1, 0, NULL), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(agoq_topo_gpu_nic_direct(t, 1, 0, NULL), AGOQ_TOPO_PATH_PHB);
  /* GPU0's own PIX path stays direct. */
  assert_int_equal(agoq_topo_gpu_nic_route(t, 0, 0, NULL, &via), AGOQ_TOPO_PATH_PIX);
  assert_int_equal(via, -1);
  agoq_topo_choose(t, &c);
  assert_int_equal(c.nic[1], 0);
  assert_int_equal(c.path[1], AGOQ_TOPO_PATH_PXN);
  assert_int_equal(c.via[1], 0);
  assert_int_equal(c.via[0], -1);

  char cell[16];
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 1, cell, sizeof cell), "NV4");
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 1, 1, cell, sizeof cell), "X");
  /* nvidia-smi shows the hardware path, never NCCL's relay. */
  assert_string_equal(agoq_topo_smi_gpu_nic(t, 1, 0, cell, sizeof cell), "NODE");
  assert_string_equal(agoq_topo_smi_gpu_nic(t, 0, 0, cell, sizeof cell), "PIX");
  free(t);
}

/* PXN needs the relay close to the NIC: a peer that itself goes through the CPU does not
 * help, and a GPU already under the NIC's switch never relays. */
static void test_pxn_needs_a_close_peer(void** state) {
  (void)state;
  agoq_topo* t = new_topo();
  add_gpu(t, loc(0, SWA "/0000:12:00.0/0000:13:00.0"));
  add_gpu(t, loc(0, SWB "/0000:22:00.0/0000:23:00.0"));
  add_nic(t, "flat", loc(0, "/sys/devices/pci0000:00/0000:00:03.0"));
  link_gpus(t, 0, 1, 2);
  int via = -2;
  assert_int_equal(agoq_topo_gpu_nic_route(t, 1, 0, NULL, &via), AGOQ_TOPO_PATH_PHB);
  assert_int_equal(via, -1);
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_int_equal(c.via[0], -1);
  assert_int_equal(c.via[1], -1);
  free(t);
}

/* NVML's facts can answer the GPU-NIC hook: a NIC at the far end of a GPU's link is NVL. */
static void test_nvml_nvl_hook(void** state) {
  (void)state;
  agoq_topo* t = new_topo();
  add_gpu(t, loc(0, SWA "/0000:12:00.0/0000:13:00.0"));
  add_nic(t, "nic0", loc(0, SWB "/0000:22:01.0/0000:24:00.0"));
  agoq_topo_gpu* g = &t->gpus[0];
  g->nvml = true;
  g->nvlinks = 1;
  g->nvlink[0] = (agoq_topo_nvlink){.link = 0, .remote = AGOQ_TOPO_NVL_UNKNOWN, .busid = "0000:24:00.0", .gpu = -1};
  assert_false(agoq_topo_nvml_nvl_hook(t, "0000:13:00.0", "0000:24:00.0")); /* not loaded yet */
  t->nvml_state = AGOQ_TOPO_NVML_LOADED;
  assert_true(agoq_topo_nvml_nvl_hook(t, "00000000:13:00.0", "0000:24:00.0"));
  assert_false(agoq_topo_nvml_nvl_hook(t, "0000:13:00.0", "0000:99:00.0"));
  assert_false(agoq_topo_nvml_nvl_hook(t, "0000:99:00.0", "0000:24:00.0"));
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 0, NULL), AGOQ_TOPO_PATH_PHB);
  agoq_topo_set_nvl_hook(agoq_topo_nvml_nvl_hook, t);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 0, NULL), AGOQ_TOPO_PATH_NVL);
  char cell[16];
  assert_string_equal(agoq_topo_smi_gpu_nic(t, 0, 0, cell, sizeof cell), "NV1");
  agoq_topo_set_nvl_hook(NULL, NULL);
  assert_int_equal(agoq_topo_gpu_nic_path(t, 0, 0, NULL), AGOQ_TOPO_PATH_PHB);
  free(t);
}

/* No NVML: a reason, and the GPUs, paths and choice exactly as before. */
static void test_nvml_missing_changes_nothing(void** state) {
  (void)state;
  agoq_topo* t = new_topo();
  add_gpu(t, loc(0, SWA "/0000:12:00.0/0000:13:00.0"));
  add_gpu(t, loc(0, SWB "/0000:22:00.0/0000:23:00.0"));
  add_nic(t, "nic0", loc(0, SWA "/0000:12:01.0/0000:14:00.0"));
  agoq_topo* before = malloc(sizeof *before);
  assert_non_null(before);
  memcpy(before, t, sizeof *t);
  agoq_topo_choice c0, c1;
  agoq_topo_choose(t, &c0);
  assert_int_equal(agoq_topo_nvml_annotate(t, "/nonexistent/libnvidia-ml.so.1"), 0);
  assert_int_equal(t->nvml_state, AGOQ_TOPO_NVML_UNAVAILABLE);
  assert_non_null(strstr(t->nvml_why, "NVML not loaded: "));
  assert_non_null(strstr(t->nvml_why, "/nonexistent/libnvidia-ml.so.1"));
  assert_memory_equal(t->gpus, before->gpus, sizeof t->gpus);
  assert_memory_equal(t->nics, before->nics, sizeof t->nics);
  agoq_topo_choose(t, &c1);
  assert_memory_equal(&c0, &c1, sizeof c0);
  for (int g = 0; g < t->ngpus; g++) assert_false(t->gpus[g].nvml);

  /* A library that is not NVML. */
  assert_int_equal(agoq_topo_nvml_annotate(t, "libc.so.6"), 0);
  assert_int_equal(t->nvml_state, AGOQ_TOPO_NVML_UNAVAILABLE);
  assert_string_equal(t->nvml_why, "NVML not usable: libc.so.6 has no nvmlInit_v2");

  /* NVML without a driver. */
  fake_reset();
  setenv("AGOQ_FAKE_NVML_SCENARIO", "nodriver", 1);
  assert_int_equal(agoq_topo_nvml_annotate(t, AGOQ_FAKE_NVML_PATH), 0);
  assert_int_equal(t->nvml_state, AGOQ_TOPO_NVML_UNAVAILABLE);
  assert_string_equal(t->nvml_why, "NVML not usable: nvmlInit_v2: Driver Not Loaded (9)");
  assert_memory_equal(t->gpus, before->gpus, sizeof t->gpus);
  assert_fake_clean();
  free(before);
  free(t);
}

/* The fake itself is strict, or the tests above would prove little. */
static void test_fake_is_strict(void** state) {
  (void)state;
  fake_reset();
  setenv("AGOQ_FAKE_NVML_SCENARIO", "nvswitch8", 1);
  void* lib = fake_lib();
  fake_int_fn init = (fake_int_fn)dlsym(lib, "nvmlInit_v2");
  fake_int_fn shutdown = (fake_int_fn)dlsym(lib, "nvmlShutdown");
  fake_count_fn count = (fake_count_fn)dlsym(lib, "nvmlDeviceGetCount_v2");
  fake_handle_fn handle = (fake_handle_fn)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
  fake_link_fn state_fn = (fake_link_fn)dlsym(lib, "nvmlDeviceGetNvLinkState");
  assert_non_null(init);
  assert_non_null(shutdown);
  assert_non_null(count);
  assert_non_null(handle);
  assert_non_null(state_fn);
  unsigned n = 0;
  void* dev = NULL;
  int active = -1;
  assert_int_equal(count(&n), 1); /* NVML_ERROR_UNINITIALIZED */
  assert_int_equal(shutdown(), 1);
  assert_int_equal(init(), 0);
  assert_int_equal(count(&n), 0);
  assert_int_equal(n, 8);
  assert_int_equal(count(NULL), 2); /* NVML_ERROR_INVALID_ARGUMENT */
  assert_int_equal(handle(8, &dev), 2);
  assert_int_equal(handle(0, &dev), 0);
  assert_int_equal(state_fn(dev, 17, &active), 0);
  assert_int_equal(active, 1);
  assert_int_equal(state_fn(dev, 18, &active), 2);
  assert_int_equal(state_fn(&n, 0, &active), 2); /* not a handle it gave out */
  assert_int_equal(state_fn(dev, 0, NULL), 2);
  assert_int_equal(shutdown(), 0);
  assert_int_equal(state_fn(dev, 0, &active), 1); /* after shutdown: uninitialized again */
  assert_int_equal(fake_call("agoq_fake_nvml_misuse"), 8);
  assert_int_equal(fake_call("agoq_fake_nvml_refcount"), 0);
  /* An unknown scenario fails nvmlInit_v2 rather than pretending to be some machine. */
  setenv("AGOQ_FAKE_NVML_SCENARIO", "no-such-scenario", 1);
  assert_int_not_equal(init(), 0);
  fake_reset();
}

#ifdef AGOQ_HAVE_HWLOC
/* ---- hwloc XML fixtures plus the fake NVML --------------------------------------------- */

static agoq_topo* load(const char* name) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", AGOQ_TOPO_FIXTURES, name);
  agoq_topo* t = calloc(1, sizeof *t);
  assert_non_null(t);
  int rc = agoq_topo_load_xml(path, t);
  if (rc != AGOQ_TOPO_OK) fail_msg("%s: %s", path, agoq_topo_strerror(rc));
  assert_false(t->this_system);
  assert_int_equal(t->nvml_state, AGOQ_TOPO_NVML_NOT_ASKED);
  return t;
}

static int annotate(agoq_topo* t, const char* scenario) {
  fake_reset();
  setenv("AGOQ_FAKE_NVML_SCENARIO", scenario, 1);
  int matched = agoq_topo_nvml_annotate(t, AGOQ_FAKE_NVML_PATH);
  assert_fake_clean();
  return matched;
}

/* HGX H100: every GPU has 18 NVLinks to the NVSwitches, so every pair is NV18 / NVL; the
 * NICs of the other switches are reached through their local GPU (PXN); each GPU still
 * keeps its own rail. */
static void test_hgx_nvswitch(void** state) {
  (void)state;
  agoq_topo* t = load("hgx-h100.xml");
  assert_int_equal(annotate(t, "nvswitch8"), 8);
  assert_int_equal(t->nvml_state, AGOQ_TOPO_NVML_LOADED);
  assert_string_equal(t->nvml_why, "");
  char cell[16];
  for (int g = 0; g < t->ngpus; g++) {
    const agoq_topo_gpu* gpu = &t->gpus[g];
    assert_true(gpu->nvml);
    assert_int_equal(gpu->nvlinks, 18);
    assert_true(gpu->nvswitch);
    for (int l = 0; l < gpu->nvlinks; l++) {
      assert_int_equal(gpu->nvlink[l].link, l);
      assert_int_equal(gpu->nvlink[l].remote, AGOQ_TOPO_NVL_SWITCH);
      assert_int_equal(gpu->nvlink[l].gpu, -1);
    }
    assert_string_equal(gpu->nvlink[0].busid, "0000:05:00.0");
    assert_string_equal(gpu->nvlink[17].busid, "0000:08:00.0");
    for (int b = 0; b < t->ngpus; b++) {
      int hops = -1;
      if (b == g) continue;
      assert_int_equal(agoq_topo_gpu_nvlinks(t, g, b), 18);
      assert_int_equal(agoq_topo_gpu_gpu_path(t, g, b, &hops), AGOQ_TOPO_PATH_NVL);
      assert_int_equal(hops, 2); /* GPU - NVSwitch - GPU */
      assert_string_equal(agoq_topo_smi_gpu_gpu(t, g, b, cell, sizeof cell), "NV18");
    }
  }
  /* GPU0 (switch of mlx5_0/1, socket 0): mlx5_2 sits behind the CPU, its local GPU is GPU2;
   * mlx5_5 is on the other socket, relayed by GPU5 (the second GPU of that switch). */
  int via = -2;
  assert_int_equal(agoq_topo_nic_local_gpu(t, 2), 2);
  assert_int_equal(agoq_topo_nic_local_gpu(t, 5), 5);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 0, 2, NULL, &via), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(via, 2);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 0, 5, NULL, &via), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(via, 5);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 0, 1, NULL, &via), AGOQ_TOPO_PATH_PIX);
  assert_int_equal(via, -1);
  assert_string_equal(agoq_topo_smi_gpu_nic(t, 0, 5, cell, sizeof cell), "SYS");
  assert_string_equal(agoq_topo_smi_gpu_nic(t, 0, 2, cell, sizeof cell), "NODE");
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  assert_true(c.rail_aligned);
  for (int g = 0; g < t->ngpus; g++) {
    assert_int_equal(c.nic[g], g);
    assert_int_equal(c.path[g], AGOQ_TOPO_PATH_PIX);
    assert_int_equal(c.via[g], -1);
  }

  /* Annotating again from a machine whose GPUs are others clears the old facts. */
  assert_int_equal(annotate(t, "pcie"), 0);
  for (int g = 0; g < t->ngpus; g++) {
    assert_false(t->gpus[g].nvml);
    assert_int_equal(t->gpus[g].nvlinks, 0);
    assert_false(t->gpus[g].nvswitch);
  }
  assert_int_equal(agoq_topo_gpu_gpu_path(t, 0, 1, NULL), AGOQ_TOPO_PATH_PIX);
  free(t);
}

/* PCIe only: NVML knows the GPUs, none has an active NVLink, nothing is NV or PXN, and the
 * paths and choice are those without NVML. */
static void test_pcie_node_no_nvlink(void** state) {
  (void)state;
  agoq_topo* t = load("gpus8-nics2.xml");
  agoq_topo_choice c0, c1;
  agoq_topo_choose(t, &c0);
  agoq_topo_path_type before[8][2];
  for (int g = 0; g < 8; g++)
    for (int k = 0; k < 2; k++) before[g][k] = agoq_topo_gpu_nic_path(t, g, k, NULL);
  assert_int_equal(annotate(t, "pcie"), 8);
  char cell[16];
  for (int g = 0; g < t->ngpus; g++) {
    assert_true(t->gpus[g].nvml);
    assert_int_equal(t->gpus[g].nvlinks, 0);
    assert_false(t->gpus[g].nvswitch);
    for (int b = 0; b < t->ngpus; b++) {
      assert_int_equal(agoq_topo_gpu_nvlinks(t, g, b), 0);
      assert_int_not_equal(agoq_topo_gpu_gpu_path(t, g, b, NULL), AGOQ_TOPO_PATH_NVL);
      assert_true(strncmp(agoq_topo_smi_gpu_gpu(t, g, b, cell, sizeof cell), "NV", 2) != 0);
    }
    for (int k = 0; k < 2; k++) assert_int_equal(agoq_topo_gpu_nic_path(t, g, k, NULL), before[g][k]);
  }
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 1, cell, sizeof cell), "PIX");
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 2, cell, sizeof cell), "PXB");
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 4, cell, sizeof cell), "SYS");
  agoq_topo_choose(t, &c1);
  assert_memory_equal(&c0, &c1, sizeof c0);
  free(t);
}

/* The same PCIe tree on an NVSwitch fabric: the other socket's NIC becomes PXN through its
 * local GPU, but each GPU's own PXB NIC stays nearer. */
static void test_gpus8_nvswitch_pxn(void** state) {
  (void)state;
  agoq_topo* t = load("gpus8-nics2.xml");
  assert_int_equal(annotate(t, "nvswitch8-gpus8"), 8);
  int via = -2;
  assert_int_equal(agoq_topo_gpu_nic_route(t, 4, 0, NULL, &via), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(via, 0);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 0, 1, NULL, &via), AGOQ_TOPO_PATH_PXN);
  assert_int_equal(via, 4);
  assert_int_equal(agoq_topo_gpu_nic_route(t, 1, 0, NULL, &via), AGOQ_TOPO_PATH_PXB);
  assert_int_equal(via, -1);
  agoq_topo_choice c;
  agoq_topo_choose(t, &c);
  for (int g = 0; g < 8; g++) {
    assert_int_equal(c.nic[g], g < 4 ? 0 : 1);
    assert_int_equal(c.path[g], AGOQ_TOPO_PATH_PXB);
    assert_int_equal(c.via[g], -1);
  }
  free(t);
}

/* NVLink bridges between pairs, from an NVML that cannot name the far end's type: the far
 * end is one of NVML's GPUs by bus id, so it is a GPU, not an NVSwitch. */
static void test_pairs_without_remote_type(void** state) {
  (void)state;
  agoq_topo* t = load("hgx-h100.xml");
  assert_int_equal(annotate(t, "pairs"), 8);
  char cell[16];
  for (int g = 0; g < t->ngpus; g++) {
    const agoq_topo_gpu* gpu = &t->gpus[g];
    assert_int_equal(gpu->nvlinks, 4);
    assert_false(gpu->nvswitch);
    for (int l = 0; l < 4; l++) {
      assert_int_equal(gpu->nvlink[l].remote, AGOQ_TOPO_NVL_GPU);
      assert_int_equal(gpu->nvlink[l].gpu, g ^ 1);
    }
    assert_int_equal(agoq_topo_gpu_nvlinks(t, g, g ^ 1), 4);
    int hops = -1;
    assert_int_equal(agoq_topo_gpu_gpu_path(t, g, g ^ 1, &hops), AGOQ_TOPO_PATH_NVL);
    assert_int_equal(hops, 1);
  }
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 1, cell, sizeof cell), "NV4");
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 2, cell, sizeof cell), "NODE");
  assert_string_equal(agoq_topo_smi_gpu_gpu(t, 0, 4, cell, sizeof cell), "SYS");
  /* GPU0's NVLink peer GPU1 is under GPU0's own switch: no relay to any other NIC. */
  for (int k = 0; k < t->nnics; k++) {
    int via = -2;
    agoq_topo_gpu_nic_route(t, 0, k, NULL, &via);
    assert_int_equal(via, -1);
  }
  free(t);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_pxn_choice),
      cmocka_unit_test(test_pxn_needs_a_close_peer),
      cmocka_unit_test(test_nvml_nvl_hook),
      cmocka_unit_test(test_nvml_missing_changes_nothing),
      cmocka_unit_test(test_fake_is_strict),
#ifdef AGOQ_HAVE_HWLOC
      cmocka_unit_test(test_hgx_nvswitch),
      cmocka_unit_test(test_pcie_node_no_nvlink),
      cmocka_unit_test(test_gpus8_nvswitch_pxn),
      cmocka_unit_test(test_pairs_without_remote_type),
#endif
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
