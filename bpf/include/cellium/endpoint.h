/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_endpoints: the pods of this node. One map answers both questions the
 * datapath asks: "which endpoint sent this?" (by source address, with the
 * ifindex check that makes spoofing impossible) and "is the destination
 * local?" (by destination address).
 */
#ifndef CELLIUM_ENDPOINT_H
#define CELLIUM_ENDPOINT_H

#include <linux/types.h>

/* The endpoint enforces policy on traffic entering it. */
#define CEL_EP_F_ENFORCE_INGRESS (1 << 0)
/* The endpoint enforces policy on traffic leaving it. */
#define CEL_EP_F_ENFORCE_EGRESS (1 << 1)
/* The endpoint's default deny in that direction comes only from policies in
 * audit mode: what it would drop passes, reported as an AUDIT verdict. */
#define CEL_EP_F_AUDIT_INGRESS (1 << 2)
#define CEL_EP_F_AUDIT_EGRESS (1 << 3)

struct endpoint_key {
	__u8 addr[16]; /* IPv4 in addr[0..4], rest zero */
	__u8 family;   /* CEL_FAMILY_IPV4 or CEL_FAMILY_IPV6 */
	__u8 pad[3];
};

struct endpoint_info {
	__u32 ifindex; /* host-side veth */
	__u16 id;      /* endpoint id, the policy map's key */
	__u16 flags;   /* CEL_EP_F_* */
	__u32 identity;
	__u8 host_mac[6]; /* host-side veth MAC: source of redirected frames */
	__u8 pod_mac[6];  /* pod-side eth0 MAC: destination of redirected frames */
	/* The identity other nodes know the endpoint by, the VNI it sends
	 * with: that of its labels without the cidr: labels of the ipBlocks
	 * covering its address (identity is node-local then), else identity. */
	__u32 cluster_identity;
};

#endif /* CELLIUM_ENDPOINT_H */
