/* agoq_topo_xml_check on what hwloc 2.x's XML writer emits (hwloc/topology-xml.c and
 * hwloc/bitmap.c of hwloc 2.x: bitmaps with empty words, length= counting characters,
 * memattr, distances2hetero, userdata, character references) and on what it must still
 * refuse. Pure: no hwloc needed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "agoq_topo_xml_check.h"

/* A two-NUMA, 4-PU machine whose bitmaps are written the way hwloc writes a 96-PU one
 * (the PUs are 0, 1, 64 and 65: "0x00000003,,0x0" is bits 64-65). OBJ goes inside the
 * first Core before its PUs, TOP after the Machine. */
static char doc[16384];

static const char* make(const char* obj, const char* top) {
  snprintf(doc, sizeof doc,
           "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
           "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
           "<topology version=\"2.0\">\n"
           "  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x00000003,,0x00000003\" "
           "complete_cpuset=\"0x00000003,,0x00000003\" allowed_cpuset=\"0x00000003,,0x00000003\" "
           "nodeset=\"0x00000003\" complete_nodeset=\"0x00000003\" allowed_nodeset=\"0x00000003\" gp_index=\"1\">\n"
           "    <object type=\"Package\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" "
           "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"2\">\n"
           "      <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" "
           "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"3\" local_memory=\"1024\">\n"
           "        <page_type size=\"4096\" count=\"0\"/>\n"
           "      </object>\n"
           "      <object type=\"Core\" os_index=\"0\" cpuset=\"0x00000003\" complete_cpuset=\"0x00000003\" "
           "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"4\">\n"
           "%s"
           "        <object type=\"PU\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" "
           "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"5\"/>\n"
           "        <object type=\"PU\" os_index=\"1\" cpuset=\"0x00000002\" complete_cpuset=\"0x00000002\" "
           "nodeset=\"0x00000001\" complete_nodeset=\"0x00000001\" gp_index=\"6\"/>\n"
           "      </object>\n"
           "    </object>\n"
           "    <object type=\"Package\" os_index=\"1\" cpuset=\"0x00000003,,0x0\" complete_cpuset=\"0x00000003,,0x0\" "
           "nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"7\">\n"
           "      <object type=\"NUMANode\" os_index=\"1\" cpuset=\"0x00000003,,0x0\" complete_cpuset=\"0x00000003,,0x0\" "
           "nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"8\" local_memory=\"1024\"/>\n"
           "      <object type=\"Core\" os_index=\"64\" cpuset=\"0x00000003,,0x0\" complete_cpuset=\"0x00000003,,0x0\" "
           "nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"9\">\n"
           "        <object type=\"PU\" os_index=\"64\" cpuset=\"0x00000001,,0x0\" complete_cpuset=\"0x00000001,,0x0\" "
           "nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"10\"/>\n"
           "        <object type=\"PU\" os_index=\"65\" cpuset=\"0x00000002,,0x0\" complete_cpuset=\"0x00000002,,0x0\" "
           "nodeset=\"0x00000002\" complete_nodeset=\"0x00000002\" gp_index=\"11\"/>\n"
           "      </object>\n"
           "    </object>\n"
           "  </object>\n"
           "%s"
           "  <support name=\"discovery.pu\"/>\n"
           "  <support name=\"custom.exported_support\"/>\n"
           "</topology>\n",
           obj, top);
  return doc;
}

static char why[512];

static int check(const char* d) { return agoq_topo_xml_check(d, strlen(d), why, sizeof why); }

static void accept(const char* obj, const char* top) {
  int rc = check(make(obj, top));
  if (rc != 0) print_error("refused: %s\n", why);
  assert_int_equal(rc, 0);
}

static void refuse(const char* obj, const char* top, const char* reason) {
  assert_int_equal(check(make(obj, top)), -1);
  if (strstr(why, reason) == NULL) print_error("reason \"%s\" lacks \"%s\"\n", why, reason);
  assert_non_null(strstr(why, reason));
}

/* hwloc_bitmap_snprintf writes a zero word between others as nothing: ",,". */
static void test_bitmap_empty_words(void** state) {
  (void)state;
  accept("", "");
  accept("", "  <cpukind cpuset=\"0x00000001,,,0x0\"/>\n");
  /* infinite bitmaps: alone, with words below, with an empty word right after the prefix */
  accept("", "  <cpukind cpuset=\"0xf...f\"/>\n");
  accept("", "  <cpukind cpuset=\"0xf...f,0x0000ffff\"/>\n");
  accept("", "  <cpukind cpuset=\"0xf...f,,0x00000001\"/>\n");
}

static void test_bitmap_malformed_still_refused(void** state) {
  (void)state;
  static const char* const bad[] = {",0x1", "0x1,", "0x1,,", "", "0x", "0x123456789", "1x1", "0x1,,x0", "0xf...f,", "0xg"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char top[128];
    snprintf(top, sizeof top, "  <cpukind cpuset=\"%s\"/>\n", bad[i]);
    refuse("", top, "invalid value for cpuset");
  }
}

/* What lstopo writes, and hwloc-annotate's distances: length= is the text's length. */
static void test_distances_length_counts_characters(void** state) {
  (void)state;
  accept("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" name=\"NUMALatency\" indexing=\"os\">\n"
         "    <indexes length=\"4\">0 1 </indexes>\n"
         "    <u64values length=\"12\">10 21 21 10 </u64values>\n"
         "  </distances2>\n");
  /* hwloc splits long arrays in chunks of ten numbers */
  accept("",
         "  <distances2 type=\"PU\" nbobjs=\"4\" kind=\"5\" indexing=\"os\">\n"
         "    <indexes length=\"10\">0 1 64 65 </indexes>\n"
         "    <u64values length=\"30\">10 20 30 40 20 10 40 30 30 40 </u64values>\n"
         "    <u64values length=\"18\">10 20 40 30 20 10 </u64values>\n"
         "  </distances2>\n");
}

static void test_distances_bad_length_refused(void** state) {
  (void)state;
  /* the count of numbers, as the old check wanted it: hwloc refuses it */
  refuse("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" indexing=\"os\">\n"
         "    <indexes length=\"2\">0 1 </indexes>\n"
         "    <u64values length=\"12\">10 21 21 10 </u64values>\n"
         "  </distances2>\n",
         "length= counts characters");
  refuse("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" indexing=\"os\">\n"
         "    <indexes length=\"4\">0 1 </indexes>\n"
         "    <u64values length=\"9\">10 21 21 </u64values>\n"
         "  </distances2>\n",
         "needs 2 indexes and 4 values");
  refuse("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" indexing=\"os\">\n"
         "    <indexes length=\"4\">0 1 </indexes>\n"
         "    <u64values length=\"15\">10 21 21 10 11 </u64values>\n"
         "  </distances2>\n",
         "more than 4 values");
  refuse("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" kind=\"5\" indexing=\"os\">\n"
         "    <indexes length=\"5\">0  1 </indexes>\n"
         "    <u64values length=\"12\">10 21 21 10 </u64values>\n"
         "  </distances2>\n",
         "single spaces");
  refuse("",
         "  <distances2 type=\"NUMANode\" nbobjs=\"2\" indexing=\"os\">\n"
         "    <indexes length=\"4\">0 1 </indexes>\n"
         "    <u64values length=\"12\">10 21 21 10 </u64values>\n"
         "  </distances2>\n",
         "without a kind");
}

static void test_distances2hetero(void** state) {
  (void)state;
  accept("",
         "  <distances2hetero nbobjs=\"2\" kind=\"9\" name=\"Bandwidth\">\n"
         "    <indexes length=\"18\">NUMANode:3 Core:4 </indexes>\n"
         "    <u64values length=\"12\">0 100 100 0 </u64values>\n"
         "  </distances2hetero>\n");
  refuse("",
         "  <distances2hetero nbobjs=\"2\" kind=\"9\">\n"
         "    <indexes length=\"4\">3 4 </indexes>\n"
         "    <u64values length=\"8\">0 1 1 0 </u64values>\n"
         "  </distances2hetero>\n",
         "TYPE:INDEX");
}

/* HMAT machines: memory attributes with initiators (object or cpuset). */
static void test_memattr(void** state) {
  (void)state;
  accept("",
         "  <memattr name=\"Bandwidth\" flags=\"5\">\n"
         "    <memattr_value target_obj_type=\"NUMANode\" target_obj_gp_index=\"3\" value=\"20000\" "
         "initiator_obj_gp_index=\"4\" initiator_obj_type=\"Core\"/>\n"
         "    <memattr_value target_obj_type=\"NUMANode\" target_obj_gp_index=\"8\" value=\"1234\" "
         "initiator_cpuset=\"0x00000003,,0x0\"/>\n"
         "  </memattr>\n"
         "  <memattr name=\"MyAttr\" flags=\"1\"/>\n");
  refuse("", "  <memattr name=\"Bandwidth\" flags=\"5\">\n    <memattr_value value=\"1\"/>\n  </memattr>\n",
         "without target_obj_type");
  refuse("",
         "  <memattr name=\"Bandwidth\" flags=\"5\">\n"
         "    <memattr_value target_obj_type=\"NUMANode\" target_obj_gp_index=\"3\" value=\"1\" initiator_obj_gp_index=\"4\"/>\n"
         "  </memattr>\n",
         "only one of");
  refuse("", "  <memattr flags=\"5\"/>\n", "without name and flags");
  refuse("", "  <memattr_value target_obj_type=\"NUMANode\" target_obj_gp_index=\"3\" value=\"1\"/>\n",
         "not allowed inside <topology>");
}

static void test_userdata_and_references(void** state) {
  (void)state;
  accept("        <userdata name=\"mine\" length=\"5\">hello</userdata>\n"
         "        <userdata length=\"5\" encoding=\"base64\">aGVsbG8=</userdata>\n"
         "        <userdata name=\"empty\" length=\"0\"/>\n"
         "        <info name=\"Note\" value=\"two&#10;lines&#9;tab&#13;&amp;&quot;\"/>\n",
         "");
  refuse("        <userdata length=\"4\">hello</userdata>\n", "", "holds 5 characters");
  refuse("        <userdata length=\"5\" encoding=\"base64\">aGVsbG8</userdata>\n", "", "holds 7 characters");
  refuse("        <userdata length=\"5\" encoding=\"hex\">68656c6c6f</userdata>\n", "", "invalid value for encoding");
  refuse("        <info name=\"Note\" value=\"&#11;\"/>\n", "", "unknown entity");
}

/* hwloc 1.x XML: said so, with the way to convert it. */
static void test_hwloc1_says_so(void** state) {
  (void)state;
  static const char v1[] =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<!DOCTYPE topology SYSTEM \"hwloc.dtd\">\n"
      "<topology>\n"
      "  <object type=\"Machine\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" "
      "online_cpuset=\"0x00000001\" allowed_cpuset=\"0x00000001\" nodeset=\"0x00000001\" "
      "complete_nodeset=\"0x00000001\" allowed_nodeset=\"0x00000001\">\n"
      "    <object type=\"Socket\" os_index=\"0\" cpuset=\"0x00000001\" complete_cpuset=\"0x00000001\" "
      "online_cpuset=\"0x00000001\" allowed_cpuset=\"0x00000001\" nodeset=\"0x00000001\" "
      "complete_nodeset=\"0x00000001\" allowed_nodeset=\"0x00000001\"/>\n"
      "  </object>\n"
      "</topology>\n";
  assert_int_equal(check(v1), -1);
  assert_non_null(strstr(why, "hwloc 1.x XML"));
  assert_non_null(strstr(why, "lstopo-no-graphics --input OLD.xml --of xml NEW.xml"));
  /* a 2.0 header over 1.x content still gets the hint */
  refuse("        <object type=\"Socket\" cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\"/>\n",
         "", "hwloc 1.x XML");
  refuse("", "  <distances nbobjs=\"1\" relative_depth=\"1\" latency_base=\"1.0\"/>\n", "hwloc 1.x XML");
  /* a version this hwloc cannot read */
  static char v3[sizeof doc];
  snprintf(v3, sizeof v3, "%s", make("", ""));
  memcpy(strstr(v3, "version=\"2.0\""), "version=\"3.0\"", 13);
  assert_int_equal(check(v3), -1);
  assert_non_null(strstr(why, "agoq reads version 2.x"));
}

/* What the crashers of tests/fuzz/corpus/topo_xml exercise stays refused. */
static void test_still_strict(void** state) {
  (void)state;
  refuse("        <object type=\"PU\" os_index=\"2\" complete_cpuset=\"0x4\" nodeset=\"0x1\" complete_nodeset=\"0x1\"/>\n", "",
         "object without cpuset");
  refuse("        <object type=\"PU\" os_index=\"2\" cpuset=\"0x4\" compleset=\"0x4\" nodeset=\"0x1\" complete_nodeset=\"0x1\"/>\n",
         "", "unknown attribute compleset");
  refuse("", "  <userdata length=\"0\"/>\n", "not allowed inside <topology>");
  /* hwloc 3.x puts infos there; hwloc 2.9 stops reading the document at one */
  refuse("", "  <info name=\"Backend\" value=\"Synthetic\"/>\n", "<info> is not allowed inside <topology>");
  /* hwloc refuses an info or userdata after the object's children */
  refuse("        <object type=\"Misc\" name=\"m\"/>\n        <info name=\"a\" value=\"b\"/>\n", "",
         "<info> after child objects");
  refuse("", "  <distances2 type=\"NUMANode\" nbobjs=\"2000\" kind=\"5\" indexing=\"os\"/>\n", "distances over 2000");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_bitmap_empty_words),
      cmocka_unit_test(test_bitmap_malformed_still_refused),
      cmocka_unit_test(test_distances_length_counts_characters),
      cmocka_unit_test(test_distances_bad_length_refused),
      cmocka_unit_test(test_distances2hetero),
      cmocka_unit_test(test_memattr),
      cmocka_unit_test(test_userdata_and_references),
      cmocka_unit_test(test_hwloc1_says_so),
      cmocka_unit_test(test_still_strict),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
