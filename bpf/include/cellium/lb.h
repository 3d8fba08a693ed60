/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * ClusterIP load balancing. cel_lb4_services holds, per frontend
 * (vip, port, protocol), slot 0 = the service (backend count, rev-NAT id)
 * and slots 1..=count = backend ids; cel_lb4_backends resolves an id to an
 * address; cel_lb4_revnat maps a rev-NAT id back to the frontend so replies
 * carry the VIP. The cel_lb6_* maps do the same for IPv6 frontends, with the
 * same slot values (struct lb4_service); backend and rev-NAT ids are one
 * space over both families.
 */
#ifndef CELLIUM_LB_H
#define CELLIUM_LB_H

#include <linux/types.h>

struct lb4_key {
	__be32 vip;
	__be16 dport;
	__u16 slot; /* 0 = the service itself, 1..=count = a backend slot */
	__u8 protocol;
	__u8 pad[3];
};

struct lb4_service {
	/* Slots >= 1: the backend id. Slot 0: the session affinity timeout in
	 * seconds (sessionAffinity ClientIP), 0 = none (Cilium keeps it there
	 * too). */
	__u32 backend_id;
	__u16 count;      /* slot 0: number of backend slots */
	__u16 rev_nat_id; /* slot 0 */
	__u8 flags;       /* slot 0: CEL_SVC_F_* */
	__u8 pad[3];
};

struct lb4_backend {
	__be32 addr;
	__be16 port;
	__u8 protocol;
	__u8 flags; /* reserved, zero */
};

struct lb4_reverse_nat {
	__be32 vip;
	__be16 port;
	__u16 pad;
};

struct lb6_key {
	__u8 vip[16];
	__be16 dport;
	__u16 slot; /* 0 = the service itself, 1..=count = a backend slot */
	__u8 protocol;
	__u8 pad[3];
};

struct lb6_backend {
	__u8 addr[16];
	__be16 port;
	__u8 protocol;
	__u8 flags; /* reserved, zero */
};

struct lb6_reverse_nat {
	__u8 vip[16];
	__be16 port;
	__u16 pad;
};

/*
 * Socket-level load balancing (lib/sock.h): cel_lb4_reverse_sk maps a
 * socket (its cookie) and the backend it was translated to back to the
 * frontend it named, for getpeername() and recvmsg().
 */
struct sock_rev4_key {
	__u64 cookie;
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct sock_rev4_value {
	__be32 vip;
	__be16 port;
	__u16 rev_nat_id;
};

struct sock_rev6_key {
	__u64 cookie;
	__u8 addr[16];
	__be16 port;
	__u16 pad;
	__u32 pad2;
};

struct sock_rev6_value {
	__u8 vip[16];
	__be16 port;
	__u16 rev_nat_id;
};

/*
 * Maglev (cel_lb_maglev): a frontend balanced by maglev has, under its
 * rev-NAT id, an inner ARRAY of u32: entry 0 is the table size M (a prime),
 * entries 1..=M the backend ids of the lookup table. A new connection takes
 * entry 1 + hash(5-tuple) % M. A frontend without one picks a slot at random.
 * The inner map is replaced whole (a new map swapped in), never rewritten in
 * place, so a packet sees one table or the other.
 */
#define CEL_LB_MAGLEV_SIZE_KEY 0

/* The seed of the connection hash: the same on every node, so that every
 * node sends a flow to the same backend. */
#define CEL_LB_MAGLEV_SEED 0x4d61676cU

/*
 * Session affinity (sessionAffinity: ClientIP), as Cilium's
 * cilium_lb{4,6}_affinity: per client address and frontend (rev-NAT id), the
 * backend its last new connection took and when. A new connection from that
 * client within the frontend's timeout takes the same backend, if
 * cel_lb_affinity_match still lists it as a backend of the frontend (it may
 * have left this frontend while another one keeps the same backend id).
 */
struct lb4_affinity_key {
	__be32 client;
	__u16 rev_nat_id;
	__u16 pad;
};

struct lb6_affinity_key {
	__u8 client[16];
	__u16 rev_nat_id;
	__u16 pad;
};

struct lb_affinity_val {
	__u64 last_used_ns; /* bpf_ktime_get_ns() of the last new connection */
	__u32 backend_id;
	__u32 pad;
};

struct lb_affinity_match {
	__u32 backend_id;
	__u16 rev_nat_id;
	__u16 pad;
};

/* Slot 0 flags (struct lb4_service's flags). */
/* Reached from outside the node too (NodePort, external IP, load balancer
 * ingress IP): cel_from_netdev translates it. */
#define CEL_SVC_F_EXTERNAL (1 << 0)
/* externalTrafficPolicy Local: a client from outside keeps its address;
 * without it, its source becomes the frontend's address (SNAT). */
#define CEL_SVC_F_LOCAL (1 << 1)
/* A load balancer ingress IP of a service with loadBalancerSourceRanges:
 * a new connection is admitted only from a client the frontend's rev-NAT id
 * lists in cel_lb4_source_range / cel_lb6_source_range (Cilium's
 * SVC_FLAG_SOURCE_RANGE). */
#define CEL_SVC_F_SOURCE_RANGE (1 << 2)

/*
 * cel_lb4_source_range / cel_lb6_source_range: LPM tries of the client
 * prefixes each such frontend admits. The rev-NAT id (and pad) are always
 * matched whole: prefixlen = CEL_LB_SRC_RANGE_STATIC_PREFIX + the client
 * prefix's length. The value is unused (1).
 */
#define CEL_LB_SRC_RANGE_STATIC_PREFIX 32

struct lb4_src_range_key {
	__u32 prefixlen;
	__u16 rev_nat_id;
	__u16 pad;
	__be32 addr;
};

struct lb6_src_range_key {
	__u32 prefixlen;
	__u16 rev_nat_id;
	__u16 pad;
	__u8 addr[16];
};

/*
 * cel_snat4 / cel_snat6: the clients from outside whose source was
 * translated to a frontend's address. Keyed on the reply's tuple as the
 * backend sends it (backend -> frontend address, backend port -> NAT port,
 * flags 0); the value is the client the reply goes back to.
 */
/* A cel_snat4/6 key of the client's direction (client -> backend), whose
 * value is the translated source it was given, so that every packet of the
 * connection gets the same. */
#define CEL_SNAT_F_FORWARD (1 << 1)
/* A cel_snat4 key of a DSR backend's reply (lib/dsr.h), at the backend's
 * node: the value is the frontend its source becomes. */
#define CEL_SNAT_F_DSR (1 << 2)

struct snat4_value {
	__be32 addr;
	__be16 port;
	__u16 pad;
};

struct snat6_value {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
};

#endif /* CELLIUM_LB_H */
