package browser

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

func TestElements(t *testing.T) {
	dom := `<svg><g class="tl-node" data-node="a&amp;b"><circle class="mk mk-applied"></circle></g><g class="tl-phase"></g>` +
		`<g class="x tl-node" data-node="n2"></g><rect class="hm-cell" data-from="n1" data-to="n2"></rect></svg>`
	rows := Elements(dom, "g", "tl-node")
	if len(rows) != 2 || rows[0]["data-node"] != "a&b" || rows[1]["data-node"] != "n2" {
		t.Errorf("rows %v", rows)
	}
	if got := Elements(dom, "circle", "mk-applied"); len(got) != 1 {
		t.Errorf("circle %v", got)
	}
	if got := Elements(dom, "rect", "tl-node"); len(got) != 0 {
		t.Errorf("rect with another class matched: %v", got)
	}
}

func TestPNGSizeAndColor(t *testing.T) {
	img := image.NewRGBA(image.Rect(0, 0, 30, 20))
	for x := range 10 {
		img.Set(x, 5, color.RGBA{0xb3, 0x26, 0x1e, 0xff})
	}
	p := filepath.Join(t.TempDir(), "x.png")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := png.Encode(f, img); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if w, h, err := PNGSize(p); err != nil || w != 30 || h != 20 {
		t.Errorf("size %dx%d %v", w, h, err)
	}
	if n, err := CountColor(p, color.RGBA{0xb3, 0x26, 0x1e, 0}, 2); err != nil || n != 10 {
		t.Errorf("red pixels %d %v", n, err)
	}
	if err := os.WriteFile(p, []byte("not a png"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := PNGSize(p); err == nil {
		t.Errorf("PNGSize accepted a non-PNG")
	}
}
