/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * Constants shared by the datapath and its user-space mirror
 * (crates/datapath-bpf/src/types.rs). Changing any number here is a layout
 * change: bump CEL_LAYOUT_VERSION so that an agent restart recreates the
 * pinned maps instead of reading them with the wrong meaning.
 */
#ifndef CELLIUM_COMMON_H
#define CELLIUM_COMMON_H

#include <linux/types.h>

/* Version of every map layout below; stored in cel_config.layout_version. */
#define CEL_LAYOUT_VERSION 1

/* Address families as stored in keys (not AF_*: keys only need 4 or 6). */
#define CEL_FAMILY_IPV4 4
#define CEL_FAMILY_IPV6 6

/*
 * Traffic direction relative to an endpoint. Used by policy keys, metrics
 * keys and events: INGRESS is traffic entering the pod, EGRESS leaving it.
 */
#define CEL_DIR_INGRESS 0
#define CEL_DIR_EGRESS 1
#define CEL_DIR_MAX 2

/* Reserved security identities (same numbers as Cilium). */
#define CEL_IDENTITY_UNKNOWN 0
#define CEL_IDENTITY_HOST 1
#define CEL_IDENTITY_WORLD 2
/* A node's health endpoint, and a pod whose labels are not resolved yet. */
#define CEL_IDENTITY_HEALTH 4
#define CEL_IDENTITY_INIT 5
/* Another node of the cluster. */
#define CEL_IDENTITY_REMOTE_NODE 6
/* The first identity allocated to label sets, cluster-wide. */
#define CEL_IDENTITY_CLUSTER_MIN 256
/* The first node-local identity: label sets with cidr: labels, numbered by
 * each node for itself (a remote pod inside a policy's ipBlock included). */
#define CEL_IDENTITY_LOCAL_MIN (1U << 24)
/* The world of one family, on a node with both (Cilium's dual-stack split). */
#define CEL_IDENTITY_WORLD_IPV4 9
#define CEL_IDENTITY_WORLD_IPV6 10

/*
 * Verdict reasons. 0 is "forwarded"; every other number is a drop reason.
 * Metrics are indexed by direction * CEL_REASON_SLOTS + reason.
 */
#define CEL_REASON_FORWARDED 0
#define CEL_REASON_INVALID_SOURCE 1
#define CEL_REASON_POLICY_DENY 2
#define CEL_REASON_POLICY_DEFAULT_DENY 3
#define CEL_REASON_NO_SERVICE_BACKEND 4
#define CEL_REASON_MALFORMED 5
/* 6 was FRAGMENT_UNSUPPORTED, before fragments were tracked: never emitted. */
#define CEL_REASON_CT_FULL 7
#define CEL_REASON_NAT_FAILED 8
/* 9 was IPV6_NOT_ENFORCED, before IPv6 was enforced: never emitted. */
/* A later fragment whose first fragment was never seen (or was forgotten):
 * nothing says which ports, policy or translation it belongs to. */
#define CEL_REASON_FRAGMENT_NOT_FOUND 10
/* A first fragment whose ports could not be recorded for the later ones. */
#define CEL_REASON_FRAGMENT_TABLE_FULL 11
/* An IPv6 extension-header chain the datapath does not parse (a header it
 * does not know, a routing header with segments left, more than
 * CEL_IPV6_MAX_EXT_HDRS headers): never passed unchecked. */
#define CEL_REASON_EXTENSION_HEADER 12
/* Tunnel mode: a packet for another node's pod could not be encapsulated
 * (nor given a tunnel key), a packet came out of the tunnel without an
 * identity, or one decapsulated for a local pod found it gone. */
#define CEL_REASON_ENCAP_FAILED 13
/* Tunnel mode: a VXLAN packet whose outer source is no node the agent knows
 * (an address the ipcache gives the remote-node identity): its VNI is not
 * believed. Native routing: a DSR option (lib/dsr.h) from anything but
 * another node. Cilium's DROP_UNKNOWN_SENDER. */
#define CEL_REASON_UNKNOWN_SENDER 14
/* Tunnel mode: a VNI carrying an identity no node sends (a reserved one
 * other than host, health and init). Cilium's DROP_INVALID_IDENTITY. */
#define CEL_REASON_INVALID_IDENTITY 15
/* An endpoint enforces this direction but has no policy map (not written
 * yet, or removed): nothing allows, so nothing passes. */
#define CEL_REASON_NO_POLICY_MAP 16
/* A new connection to a load balancer ingress IP of a service with
 * loadBalancerSourceRanges from a client none of them holds
 * (cel_lb4_source_range / cel_lb6_source_range). Cilium's
 * DROP_NOT_IN_SRC_RANGE. */
#define CEL_REASON_NOT_IN_SRC_RANGE 17
#define CEL_REASON_SLOTS 256
/* Not a verdict: the ingress slot counts the events cel_events had no room
 * for (packets: events, bytes: 0). */
#define CEL_REASON_EVENTS_LOST 255

/* IP protocol numbers used in keys (IPPROTO_* without pulling libc in). */
#define CEL_PROTO_ICMP 1
#define CEL_PROTO_TCP 6
#define CEL_PROTO_UDP 17
#define CEL_PROTO_ICMPV6 58
#define CEL_PROTO_SCTP 132

#endif /* CELLIUM_COMMON_H */
