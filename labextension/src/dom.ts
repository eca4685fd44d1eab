/** Building the panel's DOM: every class name carries the extension's prefix. */

export const PREFIX = 'jp-actormesh';

/** A ``tag`` element with classes ``cls`` (space-separated, prefixed) and optional text. */
export function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls: string | null,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls
      .split(' ')
      .map(c => `${PREFIX}-${c}`)
      .join(' ');
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
