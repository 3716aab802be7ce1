"""The bit-exact model of the NIC: the readable reference every other backend equals."""
