/*
 * A strict validator of the hwloc 2.x XML subset agoq reads (agoq-topo --xml, tests),
 * run before hwloc sees a document: hwloc 2.9's XML import dereferences NULL on documents
 * as small as one mistyped attribute name (an object without its cpuset), so anything
 * hwloc would have to guess about is refused here with a line number and a reason.
 *
 * Accepted: everything hwloc 2.x's XML writer emits (hwloc/topology-xml.c, hwloc2.dtd).
 * An optional <?xml ...?> declaration and <!DOCTYPE topology SYSTEM "...dtd">, comments
 * outside <topology> only (hwloc drops I/O objects that follow a comment inside it), then
 * one <topology version="2.x"> holding exactly one Machine object first, then distances2,
 * distances2hetero, support, memattr (with memattr_value) and cpukind elements; objects
 * of the known hwloc 2 types nested by hwloc's rules (normal objects under normal
 * objects, memory objects under normal or memory objects, I/O under normal objects,
 * bridges or PCI devices), each with the attributes its type needs (cpuset and
 * complete_cpuset for normal and memory objects, nodesets for them too, osdev_type for OS
 * devices, ...) and its page_type, info and userdata before its child objects; typed
 * values (decimal numbers, hwloc bitmaps with empty words as hwloc writes them, PCI bus
 * ids and types); the text of indexes, u64values and userdata exactly as long as its
 * length= says in characters (bytes before base64 for userdata); printable ASCII only,
 * the five predefined XML entities and &#10; &#13; &#9;, no CDATA, no processing
 * instructions, no DTD internal subset. hwloc 1.x XML (no version, Socket, online_cpuset,
 * <distances>) is refused with a message that says how to convert it.
 * Bounded: AGOQ_TOPO_XML_MAX_BYTES of input, nesting depth, elements, attributes per
 * element, attribute value length, distance matrix size. Pure: no allocation, no I/O.
 */
#ifndef AGOQ_TOPO_XML_CHECK_H
#define AGOQ_TOPO_XML_CHECK_H

#include <stddef.h>

#define AGOQ_TOPO_XML_MAX_BYTES (16u << 20)
#define AGOQ_TOPO_XML_MAX_DEPTH 48
#define AGOQ_TOPO_XML_MAX_ELEMENTS 200000
#define AGOQ_TOPO_XML_MAX_ATTRS 32
#define AGOQ_TOPO_XML_MAX_VALUE 4096
#define AGOQ_TOPO_XML_MAX_DIST_OBJS 1024

/* 0 when buf[0, len) is an acceptable document (a trailing NUL, as hwloc wants counted,
 * is allowed as the last byte); -1 otherwise, with "line N: reason" in err. */
int agoq_topo_xml_check(const char* buf, size_t len, char* err, size_t errlen);

#endif
