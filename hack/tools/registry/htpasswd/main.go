// Command htpasswd prints one htpasswd line, "USER:BCRYPT-HASH", for the user
// named by its argument and the password read from stdin. distribution's
// htpasswd auth accepts bcrypt hashes only, and neither openssl nor Python's
// standard library makes them. The password comes from stdin so it never shows
// in a process list. Hand-written: hack/gen-tool-modules.sh keeps this file.
package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

func main() {
	if len(os.Args) != 2 || os.Args[1] == "" || strings.Contains(os.Args[1], ":") {
		fmt.Fprintln(os.Stderr, "usage: htpasswd USER < password")
		os.Exit(2)
	}
	pw, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && pw == "" {
		fmt.Fprintln(os.Stderr, "htpasswd: no password on stdin")
		os.Exit(1)
	}
	// The lowest cost: the registry checks the hash on every request (each blob, manifest
	// and tag list), and this is a random test password on loopback, not a stored one.
	hash, err := bcrypt.GenerateFromPassword([]byte(strings.TrimRight(pw, "\r\n")), bcrypt.MinCost)
	if err != nil {
		fmt.Fprintln(os.Stderr, "htpasswd:", err)
		os.Exit(1)
	}
	fmt.Printf("%s:%s\n", os.Args[1], hash)
}
