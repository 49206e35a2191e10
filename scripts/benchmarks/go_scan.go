// go_scan: scan a journal with the Go original's Scanner (h12.io/sej) and print what it took.
//
// Built and run by scripts/benchmarks/go_original.py for benchmark 3, in GOPATH mode against the pinned
// source of the Go original. Usage: go_scan -n N DIR. It reads the first N messages of the journal DIR
// (a directory holding jnl/, as sej writes it: the files are byte-compatible) from offset 0, touching
// each value's length, and prints one line: "<messages> <value bytes> <nanoseconds>". The clock
// includes constructing the scanner, as benchmark 3's clock of sej's Scanner does.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"h12.io/sej"
)

func main() {
	n := flag.Int("n", 0, "messages to read")
	flag.Parse()
	if flag.NArg() != 1 || *n <= 0 {
		fmt.Fprintln(os.Stderr, "usage: go_scan -n N DIR")
		os.Exit(2)
	}
	start := time.Now()
	s, err := sej.NewScanner(flag.Arg(0), 0)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go_scan:", err)
		os.Exit(1)
	}
	s.Timeout = time.Second
	total := 0
	for i := 0; i < *n; i++ {
		if !s.Scan() {
			fmt.Fprintf(os.Stderr, "go_scan: stopped after %d of %d messages: %v\n", i, *n, s.Err())
			os.Exit(1)
		}
		total += len(s.Message().Value)
	}
	elapsed := time.Since(start)
	s.Close()
	fmt.Printf("%d %d %d\n", *n, total, elapsed.Nanoseconds())
}
