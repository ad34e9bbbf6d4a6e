package coordinator

// LoadInventory builds the inventory from the config's --agent flags and
// --inventory file together.
func (c Config) LoadInventory() (Inventory, error) {
	specs, err := ParseAgentFlags(c.Agents)
	if err != nil {
		return Inventory{}, err
	}
	source := "--agent"
	if c.InventoryFile != "" {
		fs, err := LoadInventoryFile(c.InventoryFile)
		if err != nil {
			return Inventory{}, err
		}
		specs = append(specs, fs...)
		source = c.InventoryFile
		if len(c.Agents) > 0 {
			source = "--agent + " + c.InventoryFile
		}
	}
	return NewInventory(source, specs)
}
