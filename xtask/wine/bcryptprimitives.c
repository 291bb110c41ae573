/*
 * A stand-in for Windows 10's bcryptprimitives.dll, for the wine smoke test
 * only. Rust's standard library on Windows takes its random numbers (the
 * HashMap seed) from ProcessPrng in that DLL, which Debian 12's wine 8.0
 * does not ship, so every Rust program fails to load there. This one
 * answers ProcessPrng from advapi32's RtlGenRandom (SystemFunction036),
 * which wine has. Real Windows loads its own DLL, never this.
 */
#include <windows.h>

BOOLEAN WINAPI SystemFunction036(PVOID buffer, ULONG length);

__declspec(dllexport) BOOL WINAPI ProcessPrng(PBYTE data, SIZE_T len) {
    while (len > 0) {
        ULONG n = len > 0x10000000 ? 0x10000000 : (ULONG)len;
        if (!SystemFunction036(data, n)) {
            return FALSE;
        }
        data += n;
        len -= n;
    }
    return TRUE;
}
