"""Host side: bit-exact software model of the NIC, transport, driver."""
