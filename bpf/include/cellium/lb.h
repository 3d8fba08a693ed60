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
	__u32 backend_id; /* slots >= 1 */
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

/* Slot 0 flags (struct lb4_service's flags). */
/* Reached from outside the node too (NodePort, external IP, load balancer
 * ingress IP): cel_from_netdev translates it. */
#define CEL_SVC_F_EXTERNAL (1 << 0)
/* externalTrafficPolicy Local: a client from outside keeps its address;
 * without it, its source becomes the frontend's address (SNAT). */
#define CEL_SVC_F_LOCAL (1 << 1)

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
