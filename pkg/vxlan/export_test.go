package vxlan

// SkipTopUp makes k adopt a prebuilt device without topping it up.
func SkipTopUp(k *Kernel) { k.testNoTopUp = true }

// LooseRPFilter is the bite switch of TestStagedRPFilterBites.
func LooseRPFilter(k *Kernel) { k.testLooseRPFilter = true }
