/** Numbers as the panel shows them. */

/** 1.2 GiB, 340 MiB. */
export function formatBytes(n: number | null): string {
  if (n === null) {
    return '–';
  }
  const mib = n / 2 ** 20;
  return mib >= 1024 ? `${(mib / 1024).toFixed(1)} GiB` : `${Math.round(mib)} MiB`;
}
