package vxlan

// SkipTopUp makes k adopt a prebuilt device without topping it up.
func SkipTopUp(k *Kernel) { k.testNoTopUp = true }

// LooseRPFilter is the bite switch of TestStagedRPFilterBites.
func LooseRPFilter(k *Kernel) { k.testLooseRPFilter = true }

// PauseEachStep calls f after each change the switch makes.
func PauseEachStep(k *Kernel, f func(step string)) { k.testStep = f }

// AddrsFirst is the bite switch of TestRetireEveryStepForwardsBites.
func AddrsFirst(k *Kernel) { k.testAddrsFirst = true }

// BlindWatch is the bite switch of TestArmedWatchBites: RecreateArmed
// ignores what its watch saw.
func BlindWatch(k *Kernel) { k.testBlindWatch = true }
