package vxlan

// SkipTopUp makes k adopt a prebuilt device without topping it up.
func SkipTopUp(k *Kernel) { k.testNoTopUp = true }
