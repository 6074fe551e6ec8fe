package jupyter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"testing"
)

// zmtpStream is a greeting followed by frames of the given sizes.
func zmtpStream(sizes ...int) []byte {
	b := bytes.Repeat([]byte{0xff}, zmtpGreeting)
	for _, n := range sizes {
		if n < 256 {
			b = append(b, 0x00, byte(n))
		} else {
			var sz [8]byte
			binary.BigEndian.PutUint64(sz[:], uint64(n))
			b = append(b, 0x02)
			b = append(b, sz[:]...)
		}
		b = append(b, bytes.Repeat([]byte{'x'}, n)...)
	}
	return b
}

// feed passes stream through a limitedConn in chunks of chunk bytes.
func feed(stream []byte, max uint64, chunk int) error {
	c := &frameLimiter{max: max, greeting: zmtpGreeting}
	for len(stream) > 0 {
		k := min(chunk, len(stream))
		if err := c.scan(stream[:k]); err != nil {
			return err
		}
		stream = stream[k:]
	}
	return nil
}

func TestFrameLimit(t *testing.T) {
	for _, chunk := range []int{1, 2, 7, 64, 1 << 20} {
		if err := feed(zmtpStream(0, 5, 255, 256, 1000, 4096), 4096, chunk); err != nil {
			t.Errorf("chunk %d: frames within the limit refused: %v", chunk, err)
		}
		if err := feed(zmtpStream(10, 4097), 4096, chunk); !errors.Is(err, ErrMessageTooLarge) {
			t.Errorf("chunk %d: err = %v, want ErrMessageTooLarge", chunk, err)
		}
	}
	// A size announced as 2^63 is refused before anything is allocated.
	huge := append(bytes.Repeat([]byte{0}, zmtpGreeting), 0x02, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	if err := feed(huge, DefaultMaxFrame, 3); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("err = %v", err)
	}
	var _ net.Conn = (*limitedConn)(nil)
}
