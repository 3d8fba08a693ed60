/* SPDX-License-Identifier: (GPL-2.0-only OR Apache-2.0) */
/*
 * cel_ipcache: IP prefix -> security identity. A miss means world (2).
 */
#ifndef CELLIUM_IPCACHE_H
#define CELLIUM_IPCACHE_H

#include <linux/types.h>

struct ipcache_key {
	/* LPM prefix over the bytes after this field: 32 (family + pad) plus
	 * the IP prefix length, so IPv4 and IPv6 never match each other. */
	__u32 prefixlen;
	__u8 family;
	__u8 pad[3];
	__u8 addr[16];
};

struct ipcache_value {
	__u32 identity;
	__u32 flags; /* reserved, zero */
};

#endif /* CELLIUM_IPCACHE_H */
