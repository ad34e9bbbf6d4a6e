package browser

import (
	"html"
	"image/color"
	"image/png"
	"os"
	"regexp"
	"slices"
	"strings"
)

var (
	attrRe = regexp.MustCompile(`([a-zA-Z_:][-a-zA-Z0-9_:.]*)(?:\s*=\s*"([^"]*)")?`)
)

// Elements returns the attributes of every tag element in a DOM dump (as
// Chromium serializes it: attributes double-quoted) whose class list holds
// class, in document order, values unescaped.
func Elements(dom, tag, class string) []map[string]string {
	re := regexp.MustCompile(`<` + regexp.QuoteMeta(tag) + `(\s[^>]*)?>`)
	var out []map[string]string
	for _, m := range re.FindAllStringSubmatch(dom, -1) {
		attrs := map[string]string{}
		for _, a := range attrRe.FindAllStringSubmatch(m[1], -1) {
			attrs[a[1]] = html.UnescapeString(a[2])
		}
		if slices.Contains(strings.Fields(attrs["class"]), class) {
			out = append(out, attrs)
		}
	}
	return out
}

// CountColor counts the pixels of a PNG within tol (per channel) of c.
func CountColor(path string, c color.RGBA, tol int) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	img, err := png.Decode(f)
	if err != nil {
		return 0, err
	}
	near := func(a uint32, b uint8) bool {
		d := int(a>>8) - int(b)
		return d <= tol && d >= -tol
	}
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if near(r, c.R) && near(g, c.G) && near(bl, c.B) {
				n++
			}
		}
	}
	return n, nil
}
